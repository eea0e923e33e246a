//! Output capping: whatever a run prints, only a bounded prefix is kept, cut on a UTF-8
//! character boundary, with a flag saying that something was dropped.

/// A possibly shortened text and whether anything was cut off.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Capped {
    /// The kept prefix, valid UTF-8.
    pub text: String,
    /// Whether the input was longer than the cap.
    pub truncated: bool,
}

/// Largest index `<= cut` that does not split a UTF-8 sequence of `bytes`. Invalid input is
/// tolerated: at most three continuation bytes are stepped over, as no sequence is longer.
fn utf8_floor(bytes: &[u8], cut: usize) -> usize {
    if cut >= bytes.len() {
        return bytes.len();
    }
    let mut at = cut;
    while at > 0 && cut - at < 3 && (bytes[at] & 0xC0) == 0x80 {
        at -= 1;
    }
    at
}

/// Keeps at most `cap` bytes of a byte stream, cut on a character boundary; invalid UTF-8 is
/// replaced by U+FFFD (the cap applies to the input bytes, before replacement).
pub fn cap_bytes(bytes: &[u8], cap: usize) -> Capped {
    let truncated = bytes.len() > cap;
    let kept = if truncated {
        &bytes[..utf8_floor(bytes, cap)]
    } else {
        bytes
    };
    Capped {
        text: String::from_utf8_lossy(kept).into_owned(),
        truncated,
    }
}

/// Keeps at most `cap` bytes of a string, cut on a character boundary.
pub fn cap_str(text: &str, cap: usize) -> Capped {
    if text.len() <= cap {
        return Capped {
            text: text.to_owned(),
            truncated: false,
        };
    }
    let mut at = cap;
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    Capped {
        text: text[..at].to_owned(),
        truncated: true,
    }
}

/// Bytes a character takes once JSON-encoded by the Kubernetes API server (Go's encoder, which
/// also escapes `<`, `>`, `&`, U+2028 and U+2029 as `\uXXXX`). An upper bound for any encoder.
fn encoded_len(c: char) -> usize {
    match c {
        '"' | '\\' | '\n' | '\r' | '\t' => 2,
        '<' | '>' | '&' | '\u{2028}' | '\u{2029}' => 6,
        c if (c as u32) < 0x20 => 6,
        c => c.len_utf8(),
    }
}

/// Bytes a string takes once JSON-encoded, quotes excluded (see [`encoded_len`]).
pub fn json_encoded_len(text: &str) -> usize {
    text.chars().map(encoded_len).sum()
}

/// Keeps the longest prefix of `text` whose JSON encoding fits in `budget` bytes.
fn cap_encoded(text: &str, budget: usize) -> Capped {
    let mut used = 0;
    for (i, c) in text.char_indices() {
        used += encoded_len(c);
        if used > budget {
            return Capped {
                text: text[..i].to_owned(),
                truncated: true,
            };
        }
    }
    Capped {
        text: text.to_owned(),
        truncated: false,
    }
}

/// Shortens stdout and stderr until their JSON encoding together fits in `budget` bytes, so that
/// the status object stays far below etcd's size limit whatever the code printed (a stream of
/// `<` grows sixfold when encoded). Each stream is guaranteed half the budget; a stream that
/// needs less leaves the rest to the other. Returns the two texts and whether either was cut.
pub fn fit_json_budget(stdout: &str, stderr: &str, budget: usize) -> (Capped, Capped) {
    let (out_len, err_len) = (json_encoded_len(stdout), json_encoded_len(stderr));
    if out_len + err_len <= budget {
        return (cap_encoded(stdout, budget), cap_encoded(stderr, budget));
    }
    let half = budget / 2;
    let (out_budget, err_budget) = if out_len <= half {
        (out_len, budget - out_len)
    } else if err_len <= half {
        (budget - err_len, err_len)
    } else {
        (half, budget - half)
    };
    (
        cap_encoded(stdout, out_budget),
        cap_encoded(stderr, err_budget),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_input_is_kept_whole() {
        assert_eq!(
            cap_bytes(b"hello", 5),
            Capped {
                text: "hello".into(),
                truncated: false
            }
        );
        assert_eq!(cap_bytes(b"", 0), Capped::default());
        assert_eq!(cap_str("hello", 10).text, "hello");
    }

    #[test]
    fn ascii_is_cut_exactly_at_the_cap() {
        let c = cap_bytes(b"hello world", 5);
        assert_eq!(c.text, "hello");
        assert!(c.truncated);
        let c = cap_bytes(b"x", 0);
        assert_eq!(c.text, "");
        assert!(c.truncated);
    }

    #[test]
    fn multibyte_characters_are_never_split() {
        // "é" is 2 bytes, "€" is 3, "😀" is 4.
        for (input, cap, want) in [
            ("éé", 1, ""),
            ("éé", 2, "é"),
            ("éé", 3, "é"),
            ("a€", 2, "a"),
            ("a€", 3, "a"),
            ("a€b", 4, "a€"),
            ("😀😀", 4, "😀"),
            ("😀😀", 5, "😀"),
            ("😀😀", 7, "😀"),
            ("x😀", 4, "x"),
        ] {
            let by_bytes = cap_bytes(input.as_bytes(), cap);
            let by_str = cap_str(input, cap);
            assert_eq!(by_bytes.text, want, "cap_bytes({input:?}, {cap})");
            assert_eq!(by_str.text, want, "cap_str({input:?}, {cap})");
            assert!(by_bytes.truncated && by_str.truncated);
            assert!(by_bytes.text.len() <= cap);
        }
    }

    #[test]
    fn invalid_utf8_is_replaced_not_rejected() {
        let c = cap_bytes(b"ok\xff\xfe", 10);
        assert_eq!(c.text, "ok\u{fffd}\u{fffd}");
        assert!(!c.truncated);
        // A run of stray continuation bytes: the boundary search gives up after three steps.
        let c = cap_bytes(b"\x80\x80\x80\x80\x80\x80", 5);
        assert!(c.truncated);
        assert!(c.text.chars().all(|ch| ch == '\u{fffd}'));
    }

    #[test]
    fn json_budget_leaves_small_output_alone() {
        let (o, e) = fit_json_budget("hello", "oops", 1024);
        assert_eq!((o.text.as_str(), o.truncated), ("hello", false));
        assert_eq!((e.text.as_str(), e.truncated), ("oops", false));
    }

    #[test]
    fn json_budget_counts_escapes() {
        assert_eq!(json_encoded_len("a\"<\u{1}é"), 1 + 2 + 6 + 6 + 2);
        // 100 '<' encode to 600 bytes: a 300 byte budget keeps 25 + 25 of them.
        let lt = "<".repeat(100);
        let (o, e) = fit_json_budget(&lt, &lt, 300);
        assert_eq!(o.text.len(), 25);
        assert_eq!(e.text.len(), 25);
        assert!(o.truncated && e.truncated);
    }

    #[test]
    fn json_budget_gives_unused_share_to_the_other_stream() {
        let big = "x".repeat(1000);
        let (o, e) = fit_json_budget(&big, "small", 100);
        assert_eq!(e.text, "small");
        assert!(!e.truncated);
        assert_eq!(o.text.len(), 95);
        assert!(o.truncated);
        let (o, e) = fit_json_budget("tiny", &big, 100);
        assert_eq!(o.text, "tiny");
        assert_eq!(e.text.len(), 96);
    }
}
