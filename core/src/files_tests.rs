use super::*;

#[test]
fn plain_names_pass_and_every_other_kind_of_name_is_refused() {
    for ok in [
        "data.csv",
        "chart.png",
        "a",
        "0",
        "report_2026-12.v2.txt",
        &"x".repeat(100),
    ] {
        assert_eq!(check_name(ok), Ok(()), "{ok}");
    }
    let long = "x".repeat(101);
    for bad in [
        "",
        ".",
        "..",
        "../etc/passwd",
        "/etc/passwd",
        "a/b",
        "a\\b",
        ".hidden",
        "-rf",
        "_x",
        "a b",
        "a\nb",
        "a\0b",
        "naïve.csv",
        "a:b",
        "a*b",
        "$(id)",
        "a;b",
        "~root",
        &long,
    ] {
        assert!(check_name(bad).is_err(), "{bad:?} passed");
    }
}

#[test]
fn inputs_are_bounded_in_count_bytes_and_names_and_unique() {
    let file = |name: &str, n: usize| InputFile {
        name: name.to_owned(),
        content: vec![b'x'; n],
    };
    assert!(check_inputs(&[file("a", 1), file("b", 1)]).is_ok());
    assert!(
        check_inputs(&[file("a", 1), file("a", 1)])
            .unwrap_err()
            .contains("twice")
    );
    let many: Vec<InputFile> = (0..=MAX_INPUT_FILES)
        .map(|i| file(&format!("f{i}"), 1))
        .collect();
    assert!(check_inputs(&many).unwrap_err().contains("at most 20"));
    let big = file("big", MAX_INPUT_BYTES as usize + 1);
    assert!(check_inputs(&[big]).unwrap_err().contains("bytes"));
    assert!(check_inputs(&[file("../x", 1)]).is_err());
}

#[test]
fn mime_types_follow_the_name_only_when_the_content_agrees() {
    let png = b"\x89PNG\r\n\x1a\n....";
    assert_eq!(mime_type("chart.png", png), "image/png");
    assert_eq!(mime_type("chart.PNG", png), "image/png");
    // An extension that lies about the content is not believed.
    assert_eq!(mime_type("fake.png", b"<script>"), "text/plain");
    assert_eq!(
        mime_type("fake.png", b"\x00\x01"),
        "application/octet-stream"
    );
    assert_eq!(mime_type("photo.jpg", b"\xff\xd8\xff\xe0"), "image/jpeg");
    assert_eq!(mime_type("anim.gif", b"GIF89a...."), "image/gif");
    assert_eq!(
        mime_type("photo.webp", b"RIFF\x10\0\0\0WEBPVP8 "),
        "image/webp"
    );
    // The signature decides the format among images.
    assert_eq!(mime_type("photo.png", b"\xff\xd8\xff\xe0"), "image/jpeg");
    assert_eq!(mime_type("data.csv", b"a,b\n1,2\n"), "text/csv");
    assert_eq!(
        mime_type("data.csv", b"\xff\xfe"),
        "application/octet-stream"
    );
    assert_eq!(mime_type("notes.txt", b"hi"), "text/plain");
    assert_eq!(mime_type("notes.md", b"# Title\n*hi*"), "text/markdown");
    assert_eq!(mime_type("blob.bin", b"hi"), "application/octet-stream");
    assert_eq!(
        mime_type("model.pkl", b"\x80\x04"),
        "application/octet-stream"
    );
}

/// Every file a client could render as active content (scripts, forms, external loads) comes
/// back as plain text or opaque bytes, never as an image or its own type: by its name, and by
/// its content whatever its name.
#[test]
fn active_content_is_never_declared_renderable() {
    let svg = b"<svg xmlns='http://www.w3.org/2000/svg'><script>alert(1)</script></svg>";
    let html = b"<!DOCTYPE html><html><body onload='alert(1)'></body></html>";
    let contents: [&[u8]; 12] = [
        svg,
        b"<?xml version='1.0'?><svg><script>alert(1)</script></svg>",
        b"\xef\xbb\xbf<svg onload='alert(1)'/>",
        b" \n\t <svg/>",
        html,
        b"<html><script>alert(1)</script>",
        b"<HTML><BODY>",
        b"<script>alert(1)</script>",
        b"<!-- comment --><svg/>",
        b"<?xml-stylesheet href='x.xsl'?><x/>",
        b"<iframe src='https://example.com'>",
        b"<a href='javascript:alert(1)'>x</a>",
    ];
    let names = [
        "plot.svg",
        "plot.SVG",
        "plot.png",
        "plot.jpg",
        "plot.gif",
        "plot.webp",
        "page.html",
        "page.htm",
        "page.xhtml",
        "doc.xml",
        "out.txt",
        "data.csv",
        "data.json",
        "notes.md",
        "script.py",
        "noext",
        "x.bin",
    ];
    for data in contents {
        for name in names {
            let mime = mime_type(name, data);
            assert!(
                mime == "text/plain" || mime == "application/octet-stream",
                "{name} {:?}: {mime}",
                String::from_utf8_lossy(data)
            );
            let file = OutputFile::new(name.to_owned(), data.to_vec());
            assert_ne!(file.kind(), FileKind::Image, "{name}");
        }
    }
    // Named as an active format, whatever the text: not that format.
    for name in [
        "a.svg", "a.html", "a.htm", "a.xhtml", "a.xml", "a.xsl", "a.js", "a.mjs",
    ] {
        assert_eq!(mime_type(name, b"alert(1)"), "text/plain", "{name}");
    }
    // Binary active formats are opaque bytes.
    assert_eq!(
        mime_type("report.pdf", b"%PDF-1.7\n\xe2\xe3\xcf\xd3"),
        "application/octet-stream"
    );
    assert_eq!(
        mime_type("plot.svgz", b"\x1f\x8b\x08\x00"),
        "application/octet-stream"
    );
    // UTF-16 markup is not UTF-8: opaque bytes.
    assert_eq!(
        mime_type("plot.svg", b"\xff\xfe<\0s\0v\0g\0"),
        "application/octet-stream"
    );
    // Markdown that carries HTML is plain text.
    assert_eq!(
        mime_type("notes.md", b"# Title\n<img src=x onerror=alert(1)>"),
        "text/plain"
    );
    // A polyglot is the raster image its signature says, and only shown as one.
    let polyglot = b"GIF89a/*<svg onload=alert(1)>*/";
    assert_eq!(mime_type("x.gif", polyglot), "image/gif");
    assert_eq!(mime_type("x.svg", polyglot), "text/plain");
}

#[test]
fn a_files_kind_comes_from_its_bytes_not_from_a_type_set_by_hand() {
    let png = b"\x89PNG\r\n\x1a\n....".to_vec();
    assert_eq!(
        OutputFile::new("a.png".into(), png.clone()).kind(),
        FileKind::Image
    );
    let mut forged = OutputFile::new("a.svg".into(), b"<svg onload=alert(1)/>".to_vec());
    forged.mime_type = "image/svg+xml".into();
    assert_eq!(forged.kind(), FileKind::Text);
    assert_eq!(forged.content_type(), "text/plain");
    let mut forged = OutputFile::new("a.png".into(), b"<html>".to_vec());
    forged.mime_type = "image/png".into();
    assert_eq!(forged.kind(), FileKind::Text);
    let mut forged = OutputFile::new("a.html".into(), b"<html>".to_vec());
    forged.mime_type = "text/html".into();
    assert_eq!(forged.content_type(), "text/plain");
    assert_eq!(raster_image_type(&png), Some("image/png"));
    assert_eq!(raster_image_type(b"RIFF\0\0\0\0WAVE"), None);
    assert_eq!(raster_image_type(b""), None);
}

fn runner_file(name: &str, data: &[u8]) -> RunnerFile {
    RunnerFile {
        name: name.to_owned(),
        size: data.len() as u64,
        data: BASE64.encode(data),
    }
}

#[test]
fn collect_checks_every_bound_again_and_reports_what_it_leaves_out() {
    let caps = FileCaps {
        max_files: 2,
        max_bytes: 10,
    };
    let files = [
        runner_file("a.txt", b"12345"),
        runner_file("../escape", b"x"),
        runner_file("b.txt", b"123456"),
        runner_file("c.txt", b"123"),
        runner_file("d.txt", b"1"),
        RunnerFile {
            name: "e.txt".into(),
            size: 1,
            data: "***".into(),
        },
        runner_file("a.txt", b"dup"),
    ];
    let runner_omitted = [OmittedFile {
        name: "link".into(),
        size: None,
        reason: OmitReason::NotARegularFile,
    }];
    let (kept, omitted) = collect(&files, &runner_omitted, caps);
    let names: Vec<&str> = kept.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["a.txt", "c.txt"]);
    assert_eq!(kept[0].data, b"12345");
    assert_eq!(kept[0].mime_type, "text/plain");
    let reasons: Vec<(&str, OmitReason)> = omitted
        .iter()
        .map(|o| (o.name.as_str(), o.reason))
        .collect();
    assert_eq!(
        reasons,
        [
            ("../escape", OmitReason::BadName),
            ("b.txt", OmitReason::ByteCount),
            ("d.txt", OmitReason::FileCount),
            ("e.txt", OmitReason::Unreadable),
            ("a.txt", OmitReason::BadName),
            ("link", OmitReason::NotARegularFile),
        ]
    );
    assert!(omitted_note(&omitted).unwrap().contains("6 file(s)"));
    assert_eq!(omitted_note(&[]), None);
}

#[test]
fn collect_never_exceeds_the_global_maxima_whatever_the_caps_say() {
    let caps = FileCaps {
        max_files: u32::MAX,
        max_bytes: u64::MAX,
    };
    let big = vec![0u8; MAX_OUTPUT_BYTES as usize];
    let files: Vec<RunnerFile> = (0..30)
        .map(|i| runner_file(&format!("f{i:02}"), if i == 0 { &big } else { b"x" }))
        .collect();
    let (kept, omitted) = collect(&files, &[], caps);
    assert_eq!(kept.len(), 1, "the first file fills the byte cap");
    assert_eq!(omitted.len(), 29);
    let many: Vec<RunnerFile> = (0..30)
        .map(|i| runner_file(&format!("f{i:02}"), b"x"))
        .collect();
    let (kept, _) = collect(&many, &[], caps);
    assert_eq!(kept.len(), MAX_OUTPUT_FILES as usize);
}

#[test]
fn omitted_names_are_shown_escaped_and_bounded() {
    assert_eq!(printable_name("a\nb\u{1b}[2J"), "a\\nb\\u{1b}[2J");
    assert_eq!(printable_name(&"y".repeat(500)).len(), MAX_NAME_BYTES);
}

#[test]
fn profiles_have_one_string_form_and_an_image() {
    for p in Profile::ALL {
        assert_eq!(Profile::parse(p.as_str()), Some(p));
    }
    assert_eq!(Profile::parse("gpu"), None);
    assert_eq!(Profile::Data.image_name(), "sandbox-python-data");
    assert_eq!(Profile::default(), Profile::Minimal);
}
