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
    assert_eq!(
        mime_type("fake.png", b"<script>"),
        "application/octet-stream"
    );
    assert_eq!(mime_type("photo.jpg", b"\xff\xd8\xff\xe0"), "image/jpeg");
    assert_eq!(
        mime_type("plot.svg", b"<?xml version='1.0'?><svg></svg>"),
        "image/svg+xml"
    );
    assert_eq!(
        mime_type("plot.svg", b"not an svg"),
        "application/octet-stream"
    );
    assert_eq!(mime_type("data.csv", b"a,b\n1,2\n"), "text/csv");
    assert_eq!(
        mime_type("data.csv", b"\xff\xfe"),
        "application/octet-stream"
    );
    assert_eq!(mime_type("notes.txt", b"hi"), "text/plain");
    assert_eq!(mime_type("blob.bin", b"hi"), "application/octet-stream");
    assert_eq!(
        mime_type("model.pkl", b"\x80\x04"),
        "application/octet-stream"
    );
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
