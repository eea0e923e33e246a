//! Files a tool returns: the real agent binary, the scripted model and the embedded
//! `sandboxrun-mcp stdio`. An image is saved on this machine and the model is told where (it
//! cannot see images through a tool message); a text file reaches the model as text; a binary
//! file is described by name, type and size.

// Tests state what they expect with unwrap and expect: a failure is the message.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::PathBuf;

use common::{Reply, ScriptedModel, agent, run, sandbox_available, temp_dir};
use serde_json::json;

/// Writes a valid 3x2 PNG with the standard library only (the minimal profile has no
/// matplotlib), a CSV, a binary file, an SVG with a script and an HTML page named as a PNG into
/// /tmp/outputs.
const CODE: &str = r#"
import struct, zlib
def chunk(kind, data):
    return struct.pack('>I', len(data)) + kind + data + struct.pack('>I', zlib.crc32(kind + data))
raw = b''.join(b'\x00' + b'\xff\x00\x00' * 3 for _ in range(2))
png = (b'\x89PNG\r\n\x1a\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', 3, 2, 8, 2, 0, 0, 0))
       + chunk(b'IDAT', zlib.compress(raw)) + chunk(b'IEND', b''))
open('/tmp/outputs/chart.png', 'wb').write(png)
open('/tmp/outputs/totals.csv', 'w').write('region,total\nnorth,220\n')
open('/tmp/outputs/model.bin', 'wb').write(bytes([0, 1, 2, 255]))
open('/tmp/outputs/plot.svg', 'w').write("<svg xmlns='http://www.w3.org/2000/svg'><script>alert(1)</script></svg>")
open('/tmp/outputs/fake.png', 'w').write('<!DOCTYPE html><script>alert(1)</script>')
print('png', len(png))
"#;

/// The path the tool message says the image was saved at.
fn saved_path(tool_result: &str) -> PathBuf {
    let marker = "was saved on the user's machine at ";
    let start = tool_result
        .find(marker)
        .unwrap_or_else(|| panic!("no saved path in: {tool_result}"))
        + marker.len();
    let rest = &tool_result[start..];
    PathBuf::from(&rest[..rest.find("; you cannot see it").unwrap()])
}

#[tokio::test]
async fn returned_files_reach_the_model_and_images_the_disk() {
    if !sandbox_available().await {
        return;
    }
    let model = ScriptedModel::start(|turn| match turn.index {
        0 => Reply::call("run_python", json!({"code": CODE})),
        1 => Reply::call("run_python", json!({"code": CODE})),
        _ => {
            let result = turn.tool_result();
            Reply::text(format!(
                "The chart is at {}.",
                saved_path(&result).display()
            ))
        }
    })
    .await;
    let home = temp_dir("files");
    let files_dir = home.join("out");
    let mut command = agent(&model.base_url(), &home);
    command
        .arg("--json")
        .arg("--files-dir")
        .arg(&files_dir)
        .arg("Chart the totals");
    let out = run(command).await.success();
    let requests = model.requests();
    assert_eq!(requests.len(), 3);

    let first = requests[1]["messages"].as_array().unwrap().last().unwrap()["content"]
        .as_str()
        .unwrap()
        .to_owned();
    // The image, by name, and where it went.
    assert!(
        first.contains("[the image chart.png (image/png, "),
        "{first}"
    );
    let chart = saved_path(&first);
    assert_eq!(chart, files_dir.join("chart.png"));
    let png = std::fs::read(&chart).unwrap();
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"));
    assert_eq!(&png[16..24], &[0, 0, 0, 3, 0, 0, 0, 2]);
    // The text file as text, the binary one described.
    assert!(
        first.contains(
            "[file totals.csv (text/csv, file:///tmp/outputs/totals.csv):]\nregion,total\nnorth,220\n"
        ),
        "{first}"
    );
    assert!(
        first.contains(
            "[binary file model.bin (application/octet-stream, 4 bytes, file:///tmp/outputs/model.bin), not shown]"
        ),
        "{first}"
    );
    // Active content comes back as plain text, whatever its name, and is never saved.
    assert!(
        first.contains("[file plot.svg (text/plain, file:///tmp/outputs/plot.svg):]\n<svg "),
        "{first}"
    );
    assert!(
        first.contains(
            "[file fake.png (text/plain, file:///tmp/outputs/fake.png):]\n<!DOCTYPE html>"
        ),
        "{first}"
    );
    assert!(!files_dir.join("plot.svg").exists() && !files_dir.join("fake.png").exists());
    // The same image again: a new file, the first one kept.
    let second = requests[2]["messages"].as_array().unwrap().last().unwrap()["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(saved_path(&second), files_dir.join("chart-2.png"));
    assert_eq!(std::fs::read(files_dir.join("chart-2.png")).unwrap(), png);

    // The user is told on stderr, the transcript records it.
    assert!(
        out.stderr
            .contains(&format!("saved chart.png → {}", chart.display())),
        "{}",
        out.stderr
    );
    let t = out.transcript();
    let saved = &t["toolCalls"][0]["savedFiles"];
    assert_eq!(
        saved,
        &json!([{
            "name": "chart.png",
            "path": chart,
            "mimeType": "image/png",
            "size": png.len(),
        }])
    );
    assert_eq!(
        t["answer"],
        format!(
            "The chart is at {}.",
            files_dir.join("chart-2.png").display()
        )
    );
}
