//! The one definition of what an agent name may be. An agent name is an identity: policy rules
//! match it, sessions and rate limits are keyed by it, it is stored in `spec.agent`, written to
//! audit lines, metric labels and Events, and shown to people in terminals (`kubectl get`,
//! `kubectl sandboxrun top agents`). Every place a name enters the system checks it here: the
//! OAuth claim (with its prefix), API key files and Secrets, the stdio server's `--agent`, and
//! the CRD's `spec.agent` pattern for runs created directly ([`AGENT_NAME_PATTERN`]).
//!
//! The set is printable ASCII without spaces, quotes, backslashes, glob or shell metacharacters,
//! so that two names that look alike are alike (no control, invisible or bidirectional
//! characters, no leading or trailing space to merge or split identities, no homoglyphs), and a
//! name is safe to print anywhere. It still holds what identities look like: `analyst-01`,
//! e-mail addresses (`alice+ci@example.com`), OIDC subjects (UUIDs, `auth0|5f7c...`,
//! `CgVhbGljZRIFbG9jYWw=`), Kubernetes user names (`system:serviceaccount:team:bot`,
//! `https://dex.example.com#CgVh...`) and prefixed ones (`oauth:alice`).

/// Most characters (and bytes: the set is ASCII) of an agent name; `spec.agent` holds as many.
pub const MAX_AGENT_NAME_LEN: usize = 253;

/// The characters an agent name may hold after its first, which is a letter or a digit.
const PUNCTUATION: &str = "._:@+|/#=-";

/// The set as a regular expression: the CRD's `spec.agent` pattern, the same rule as
/// [`validate_agent_name`].
pub const AGENT_NAME_PATTERN: &str = "^[A-Za-z0-9][A-Za-z0-9._:@+|/#=-]{0,252}$";

/// The set in words, for error messages and documentation.
pub const AGENT_NAME_RULE: &str = "1 to 253 characters: ASCII letters, digits and . _ : @ + | / # \
                                   = -, starting with a letter or digit (no spaces, control, \
                                   invisible or non-ASCII characters)";

fn allowed(c: char, first: bool) -> bool {
    c.is_ascii_alphanumeric() || (!first && PUNCTUATION.contains(c))
}

/// Whether `name` is a valid agent name; the error says what is wrong, showing the name with
/// its unprintable characters escaped, and the rule.
pub fn validate_agent_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err(format!(
            "the agent name is empty; an agent name is {AGENT_NAME_RULE}"
        ));
    }
    let count = name.chars().count();
    if count > MAX_AGENT_NAME_LEN {
        return Err(format!(
            "the agent name {} has {count} characters; an agent name is {AGENT_NAME_RULE}",
            shown(name)
        ));
    }
    if let Some((i, c)) = name.chars().enumerate().find(|&(i, c)| !allowed(c, i == 0)) {
        let what = if c == ' ' {
            "a space".to_owned()
        } else {
            format!("the character U+{:04X}", u32::from(c))
        };
        return Err(format!(
            "the agent name {} has {what} at position {}; an agent name is {AGENT_NAME_RULE}",
            shown(name),
            i + 1
        ));
    }
    Ok(())
}

/// A name as an error shows it: quoted, at most 80 characters, everything but printable ASCII
/// escaped as `\u{...}`.
fn shown(name: &str) -> String {
    let escaped: String = name
        .chars()
        .take(80)
        .map(|c| {
            if (c.is_ascii_graphic() && c != '"' && c != '\\') || c == ' ' {
                c.to_string()
            } else {
                c.escape_unicode().to_string()
            }
        })
        .collect();
    let more = if name.chars().count() > 80 { "..." } else { "" };
    format!("\"{escaped}{more}\"")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_as_they_come_are_accepted() {
        for name in [
            "a",
            "analyst-01",
            "fuzz-a",
            "e2e-agent",
            "local",
            "oauth:alice",
            "alice+ci@example.com",
            "auth0|5f7c8ec7c33c6c004bbafe82",
            "google-oauth2|1234567890",
            "248289761001",
            "3f2a1b9c-0d4e-4f5a-8b6c-7d8e9f0a1b2c",
            "CgVhbGljZRIFbG9jYWw=",
            "system:serviceaccount:team:bot",
            "https://dex.example.com#CgVhbGljZRIFbG9jYWw",
            "spiffe://example.org/ns/team/sa/bot",
            "analyst_example.com",
        ] {
            assert_eq!(validate_agent_name(name), Ok(()), "{name}");
        }
        let longest = format!("a{}", "b".repeat(MAX_AGENT_NAME_LEN - 1));
        assert_eq!(validate_agent_name(&longest), Ok(()));
    }

    #[test]
    fn names_that_could_pass_for_others_or_hide_something_are_refused() {
        let cases = [
            ("", "empty"),
            (" alice", "a space at position 1"),
            ("alice ", "a space at position 6"),
            ("al ice", "a space"),
            ("alice\n", "U+000A"),
            ("al\u{1b}]0;owned\u{7}ice", "U+001B"),
            ("al\u{202e}ecila", "U+202E"),
            ("al\u{2066}ice", "U+2066"),
            ("al\u{200b}ice", "U+200B"),
            ("al\u{200e}ice", "U+200E"),
            ("\u{feff}alice", "U+FEFF"),
            ("alic\u{0435}", "U+0435"),
            ("ali\u{85}ce", "U+0085"),
            ("alice\u{7f}", "U+007F"),
            ("-alice", "U+002D at position 1"),
            (".hidden", "U+002E"),
            ("a*", "U+002A"),
            ("a\"b", "U+0022"),
            ("a\\b", "U+005C"),
            ("a$(id)", "U+0024"),
            ("a'b", "U+0027"),
            ("a,b", "U+002C"),
        ];
        for (name, why) in cases {
            let err = validate_agent_name(name).unwrap_err();
            assert!(err.contains(why), "{name:?}: {err}");
            assert!(err.contains("an agent name is 1 to 253"), "{err}");
            // The message itself carries nothing unprintable.
            assert!(
                err.chars().all(|c| c.is_ascii_graphic() || c == ' '),
                "{name:?}: {err:?}"
            );
        }
        let long = "a".repeat(MAX_AGENT_NAME_LEN + 1);
        let err = validate_agent_name(&long).unwrap_err();
        assert!(err.contains("254 characters") && err.len() < 400, "{err}");
    }

    #[test]
    fn the_pattern_says_what_the_function_does() {
        // The pattern's classes, spelled out, are the function's.
        let inner = format!("[A-Za-z0-9{PUNCTUATION}]");
        assert!(AGENT_NAME_PATTERN.contains(&inner), "{AGENT_NAME_PATTERN}");
        assert!(AGENT_NAME_PATTERN.ends_with(&format!("{{0,{}}}$", MAX_AGENT_NAME_LEN - 1)));
        for c in (0u8..=127).map(char::from) {
            let expected = c.is_ascii_alphanumeric() || PUNCTUATION.contains(c);
            assert_eq!(
                validate_agent_name(&format!("a{c}")).is_ok(),
                expected,
                "{c:?}"
            );
        }
    }
}
