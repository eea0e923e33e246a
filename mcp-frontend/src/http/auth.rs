//! API keys for remote callers. Keys are never stored: the key file (or Secret) lists the
//! SHA-256 of each key with the agent identity it stands for. A presented key is hashed and
//! compared with every entry in constant time, so neither timing nor an early exit tells how
//! much of a guess was right.

use std::path::Path;

use std::collections::HashMap;

use axum::http::HeaderMap;
use sandboxrun_core::{Environment, validate_agent_name};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::{ConditionallySelectable, ConstantTimeEq};

/// One line of the key file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyEntry {
    /// Identity recorded for calls made with this key.
    agent: String,
    /// Lowercase or uppercase hex SHA-256 of the key (what `sandboxrun-mcp hash-key` prints).
    sha256: String,
    /// Environments calls with this key may target; only `sandbox` when absent. The caller
    /// chooses a call's environment, so what it may choose is bound to its identity here.
    #[serde(default = "sandbox_only")]
    environments: Vec<Environment>,
}

fn sandbox_only() -> Vec<Environment> {
    vec![Environment::Sandbox]
}

/// Why a key file was refused. Every message names the source and the entry.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KeyFileError {
    /// The file could not be read.
    #[error("cannot read API key file {source_name}: {message}")]
    Read {
        /// File path or Secret name.
        source_name: String,
        /// The I/O error.
        message: String,
    },
    /// The YAML is not a list of `{agent, sha256}` entries.
    #[error(
        "API keys in {source_name} are not a YAML list of {{agent, sha256}} entries: {message}"
    )]
    Syntax {
        /// File path or Secret name.
        source_name: String,
        /// The parser's explanation.
        message: String,
    },
    /// An entry is present but wrong.
    #[error("API key entry {index} in {source_name}: {message}")]
    Entry {
        /// File path or Secret name.
        source_name: String,
        /// Position of the entry, from 1.
        index: usize,
        /// What is wrong with it.
        message: String,
    },
    /// No entry at all: every request would be refused.
    #[error("{source_name} lists no API keys; add entries with `sandboxrun-mcp hash-key`")]
    Empty {
        /// File path or Secret name.
        source_name: String,
    },
}

/// SHA-256 of a key, as lowercase hex.
pub fn hash_key(key: &str) -> String {
    hex::encode(Sha256::digest(key.as_bytes()))
}

/// The accepted keys (as hashes) and their agents.
#[derive(Clone, Debug, Default)]
pub struct KeyStore {
    entries: Vec<(String, [u8; 32])>,
    /// The environments each agent's keys may target (the union over its keys).
    environments: HashMap<String, Vec<Environment>>,
}

impl KeyStore {
    /// Parses key-file YAML; `source_name` only labels errors.
    pub fn parse(yaml: &str, source_name: &str) -> Result<Self, KeyFileError> {
        let entries: Vec<KeyEntry> =
            serde_saphyr::from_str(yaml).map_err(|e| KeyFileError::Syntax {
                source_name: source_name.to_owned(),
                message: e.to_string(),
            })?;
        if entries.is_empty() {
            return Err(KeyFileError::Empty {
                source_name: source_name.to_owned(),
            });
        }
        let mut store = KeyStore::default();
        for (i, entry) in entries.into_iter().enumerate() {
            let err = |message: String| KeyFileError::Entry {
                source_name: source_name.to_owned(),
                index: i + 1,
                message,
            };
            // Exactly as written: a name with a space or an invisible character would be an
            // identity of its own that looks like another.
            let agent = entry.agent.as_str();
            validate_agent_name(agent).map_err(err)?;
            let mut hash = [0u8; 32];
            hex::decode_to_slice(entry.sha256.trim(), &mut hash).map_err(|_| {
                err(
                    "sha256 must be 64 hex digits (the output of `sandboxrun-mcp hash-key`)"
                        .to_owned(),
                )
            })?;
            if store.entries.iter().any(|(_, h)| *h == hash) {
                return Err(err(
                    "the same key hash is listed twice; each key must map to one agent".to_owned(),
                ));
            }
            if entry.environments.is_empty() {
                return Err(err(
                    "environments is empty: list what the key may target (sandbox, staging, \
                     production), or leave it out for sandbox only"
                        .to_owned(),
                ));
            }
            store.entries.push((agent.to_owned(), hash));
            store.allow(agent, &entry.environments);
        }
        Ok(store)
    }

    /// Reads a key file.
    pub fn load_file(path: &Path) -> Result<Self, KeyFileError> {
        let name = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| KeyFileError::Read {
            source_name: name.clone(),
            message: e.to_string(),
        })?;
        Self::parse(&text, &name)
    }

    /// Adds the entries of another store (file plus Secret).
    pub fn merge(&mut self, other: KeyStore) {
        for (agent, hash) in other.entries {
            if !self.entries.iter().any(|(_, h)| *h == hash) {
                self.entries.push((agent, hash));
            }
        }
        for (agent, environments) in other.environments {
            self.allow(&agent, &environments);
        }
    }

    fn allow(&mut self, agent: &str, environments: &[Environment]) {
        let allowed = self.environments.entry(agent.to_owned()).or_default();
        for e in environments {
            if !allowed.contains(e) {
                allowed.push(*e);
            }
        }
    }

    /// The environments each agent's keys may target.
    pub fn environments(&self) -> HashMap<String, Vec<Environment>> {
        self.environments.clone()
    }

    /// The agents of the keys.
    pub fn agents(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|(agent, _)| agent.as_str())
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no key is configured.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The agent of a presented key, comparing its hash with every entry in constant time.
    pub fn agent_for(&self, presented: &str) -> Option<&str> {
        let digest: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        let mut found = u64::MAX;
        for (i, (_, hash)) in self.entries.iter().enumerate() {
            let equal = hash.ct_eq(&digest);
            found = u64::conditional_select(&found, &(i as u64), equal);
        }
        usize::try_from(found)
            .ok()
            .and_then(|i| self.entries.get(i))
            .map(|(agent, _)| agent.as_str())
    }
}

/// The credential in `Authorization: Bearer …`, if any.
pub fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, rest) = v.trim().split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
        })
        .filter(|t| !t.is_empty())
}

/// The key a request presents: `Authorization: Bearer KEY`, else `X-Api-Key: KEY`.
pub fn presented_key(headers: &HeaderMap) -> Option<&str> {
    bearer_token(headers)
        .or_else(|| {
            headers
                .get("x-api-key")
                .and_then(|v| v.to_str().ok())
                .map(str::trim)
        })
        .filter(|k| !k.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY_A: &str = "alpha-secret";
    const KEY_B: &str = "beta-secret";

    fn store() -> KeyStore {
        let yaml = format!(
            "- agent: analyst-01\n  sha256: {}\n- agent: ci-bot\n  sha256: {}\n",
            hash_key(KEY_A),
            hash_key(KEY_B).to_uppercase()
        );
        KeyStore::parse(&yaml, "keys.yaml").unwrap()
    }

    #[test]
    fn a_key_targets_the_sandbox_unless_its_entry_lists_more() {
        let s = store();
        assert_eq!(s.environments()["analyst-01"], [Environment::Sandbox]);
        let yaml = format!(
            "- agent: ops\n  sha256: {}\n  environments: [sandbox, production]\n",
            hash_key(KEY_A)
        );
        let s = KeyStore::parse(&yaml, "k").unwrap();
        assert_eq!(
            s.environments()["ops"],
            [Environment::Sandbox, Environment::Production]
        );
        let yaml = format!(
            "- agent: ops\n  sha256: {}\n  environments: []\n",
            hash_key(KEY_A)
        );
        assert!(KeyStore::parse(&yaml, "k").is_err());
        let yaml = format!(
            "- agent: ops\n  sha256: {}\n  environments: [prod]\n",
            hash_key(KEY_A)
        );
        assert!(KeyStore::parse(&yaml, "k").is_err());
    }

    #[test]
    fn hash_is_sha256_hex() {
        // sha256("abc"), from FIPS 180-2.
        assert_eq!(
            hash_key("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn keys_map_to_their_agents() {
        let s = store();
        assert_eq!(s.len(), 2);
        assert_eq!(s.agent_for(KEY_A), Some("analyst-01"));
        assert_eq!(s.agent_for(KEY_B), Some("ci-bot"));
        assert_eq!(s.agent_for("alpha-secreT"), None);
        assert_eq!(s.agent_for(""), None);
        assert_eq!(KeyStore::default().agent_for(KEY_A), None);
    }

    #[test]
    fn comparison_examines_every_entry() {
        // The match is found wherever it sits: no early exit decides the answer.
        let mut s = KeyStore::default();
        for i in 0..50 {
            s.entries
                .push((format!("a{i}"), Sha256::digest(format!("k{i}")).into()));
        }
        assert_eq!(s.agent_for("k0"), Some("a0"));
        assert_eq!(s.agent_for("k49"), Some("a49"));
        assert_eq!(s.agent_for("k50"), None);
    }

    #[test]
    fn file_errors_say_what_is_wrong() {
        let e = KeyStore::parse("agent: x", "f.yaml").unwrap_err();
        assert!(matches!(e, KeyFileError::Syntax { .. }), "{e}");
        let e = KeyStore::parse("[]", "f.yaml").unwrap_err();
        assert_eq!(
            e,
            KeyFileError::Empty {
                source_name: "f.yaml".into()
            }
        );
        let e = KeyStore::parse("- agent: a\n  sha256: xyz\n", "f.yaml").unwrap_err();
        assert!(
            e.to_string()
                .contains("entry 1 in f.yaml: sha256 must be 64 hex digits"),
            "{e}"
        );
        let e = KeyStore::parse(&format!("- agent: ''\n  sha256: {}\n", hash_key("k")), "f")
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("entry 1 in f: the agent name is empty; an agent name is 1 to 253"),
            "{e}"
        );
        // Names that could pass for another agent or carry terminal controls, exactly as
        // written (YAML escapes make every character writable).
        for (agent, why) in [
            ("' analyst-01'", "a space at position 1"),
            ("'analyst-01 '", "a space at position 11"),
            ("\"analyst\\u202e10\"", "U+202E"),
            ("\"ana\\e]52;c;ZWNobyBoaQ==\\alyst\"", "U+001B"),
            ("\"ana\\rlyst\"", "U+000D"),
            ("\"analyst-0\\u200b1\"", "U+200B"),
            ("'*'", "U+002A"),
            (&"a".repeat(254), "254 characters"),
        ] {
            let e = KeyStore::parse(
                &format!("- agent: {agent}\n  sha256: {}\n", hash_key("k")),
                "f",
            )
            .unwrap_err();
            assert!(e.to_string().contains(why), "{agent}: {e}");
        }
        let ok = KeyStore::parse(
            &format!(
                "- agent: alice+ci@example.com\n  sha256: {}\n",
                hash_key("k")
            ),
            "f",
        )
        .unwrap();
        assert_eq!(ok.agent_for("k"), Some("alice+ci@example.com"));
        let h = hash_key("k");
        let e = KeyStore::parse(
            &format!("- {{agent: a, sha256: {h}}}\n- {{agent: b, sha256: {h}}}\n"),
            "f",
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("entry 2") && e.to_string().contains("twice"),
            "{e}"
        );
        let e = KeyStore::parse(&format!("- {{agent: a, sha265: {h}}}\n"), "f").unwrap_err();
        assert!(
            matches!(e, KeyFileError::Syntax { .. }),
            "typo in a field name: {e}"
        );
        let e = KeyStore::load_file(Path::new("/nonexistent/keys.yaml")).unwrap_err();
        assert!(matches!(e, KeyFileError::Read { .. }));
    }

    #[test]
    fn merge_keeps_first_agent_for_a_hash() {
        let mut s = store();
        s.merge(
            KeyStore::parse(
                &format!(
                    "- {{agent: other, sha256: {}}}\n- {{agent: new, sha256: {}}}",
                    hash_key(KEY_A),
                    hash_key("c")
                ),
                "s",
            )
            .unwrap(),
        );
        assert_eq!(s.len(), 3);
        assert_eq!(s.agent_for(KEY_A), Some("analyst-01"));
        assert_eq!(s.agent_for("c"), Some("new"));
    }

    #[test]
    fn keys_are_read_from_either_header() {
        let mut h = HeaderMap::new();
        assert_eq!(presented_key(&h), None);
        h.insert("x-api-key", " k1 ".parse().unwrap());
        assert_eq!(presented_key(&h), Some("k1"));
        h.insert("authorization", "bearer k2".parse().unwrap());
        assert_eq!(presented_key(&h), Some("k2"));
        h.insert("authorization", "Basic abc".parse().unwrap());
        assert_eq!(presented_key(&h), Some("k1"));
        let mut h = HeaderMap::new();
        h.insert("authorization", "Bearer ".parse().unwrap());
        assert_eq!(presented_key(&h), None);
    }
}
