//! A rule's `python` section: which sandbox profiles its calls may use and how many files they may
//! pass in and get back.
//!
//! ```yaml
//! python:
//!   profiles: [minimal, data]   # default: [minimal]
//!   maxInputFiles: 5            # default and most: crate::files::MAX_INPUT_FILES
//!   maxInputBytes: 65536        # default and most: crate::files::MAX_INPUT_BYTES
//!   maxOutputFiles: 5           # default and most: crate::files::MAX_OUTPUT_FILES
//!   maxOutputBytes: 131072      # default and most: crate::files::MAX_OUTPUT_BYTES
//! ```

use serde::{Deserialize, Serialize};

use super::{CallContext, Rule};
use crate::files::{
    FileCaps, MAX_INPUT_BYTES, MAX_INPUT_FILES, MAX_OUTPUT_BYTES, MAX_OUTPUT_FILES, Profile,
};
use crate::model::Tool;

/// What a `python` call asks for beyond its limits: its profile and its input files.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PythonRequest {
    /// The sandbox profile.
    pub profile: Profile,
    /// How many input files it passes.
    pub input_files: u32,
    /// How many bytes they hold together.
    pub input_bytes: u64,
}

fn minimal() -> Vec<Profile> {
    vec![Profile::Minimal]
}

/// A rule's `python` section (see the module documentation).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PythonRules {
    /// The profiles the rule's calls may use.
    #[serde(default = "minimal")]
    pub profiles: Vec<Profile>,
    /// Most input files per call.
    #[serde(default = "max_input_files")]
    pub max_input_files: u32,
    /// Most input bytes per call, all files together.
    #[serde(default = "max_input_bytes")]
    pub max_input_bytes: u64,
    /// Most files returned per call.
    #[serde(default = "max_output_files")]
    pub max_output_files: u32,
    /// Most bytes returned per call, all files together.
    #[serde(default = "max_output_bytes")]
    pub max_output_bytes: u64,
}

fn max_input_files() -> u32 {
    MAX_INPUT_FILES
}
fn max_input_bytes() -> u64 {
    MAX_INPUT_BYTES
}
fn max_output_files() -> u32 {
    MAX_OUTPUT_FILES
}
fn max_output_bytes() -> u64 {
    MAX_OUTPUT_BYTES
}

impl Default for PythonRules {
    fn default() -> Self {
        Self {
            profiles: minimal(),
            max_input_files: MAX_INPUT_FILES,
            max_input_bytes: MAX_INPUT_BYTES,
            max_output_files: MAX_OUTPUT_FILES,
            max_output_bytes: MAX_OUTPUT_BYTES,
        }
    }
}

impl PythonRules {
    /// Checks the bounds against the global maxima.
    pub fn validate(&self) -> Result<(), String> {
        if self.profiles.is_empty() {
            return Err("python.profiles is empty; list minimal and/or data".to_owned());
        }
        let over = |what: &str, value: u64, max: u64| {
            (value > max).then(|| format!("python.{what} is {value}; the most allowed is {max}"))
        };
        let problem = over(
            "maxInputFiles",
            self.max_input_files.into(),
            MAX_INPUT_FILES.into(),
        )
        .or_else(|| over("maxInputBytes", self.max_input_bytes, MAX_INPUT_BYTES))
        .or_else(|| {
            over(
                "maxOutputFiles",
                self.max_output_files.into(),
                MAX_OUTPUT_FILES.into(),
            )
        })
        .or_else(|| over("maxOutputBytes", self.max_output_bytes, MAX_OUTPUT_BYTES));
        problem.map_or(Ok(()), Err)
    }

    /// The bounds on the files a call returns.
    pub fn output_caps(&self) -> FileCaps {
        FileCaps {
            max_files: self.max_output_files,
            max_bytes: self.max_output_bytes,
        }
        .clamped()
    }
}

/// Why `rule` (or, with none, the defaults) refuses the profile or the input files of a python
/// `call`; `None` when it does not, or the call is not a python call.
pub(super) fn refusal(rule: Option<&Rule>, call: &CallContext) -> Option<String> {
    if call.tool != Tool::Python {
        return None;
    }
    let request = call.python.clone().unwrap_or_default();
    let defaults = PythonRules::default();
    let rules = rule.and_then(|r| r.python.as_ref()).unwrap_or(&defaults);
    let by = rule.map_or_else(
        || "the policy default".to_owned(),
        |r| format!("rule {}", r.name),
    );
    if !rules.profiles.contains(&request.profile) {
        let allowed: Vec<&str> = rules.profiles.iter().map(|p| p.as_str()).collect();
        return Some(format!(
            "the {} profile is not allowed by {by}: use profile {} (or ask an operator for a \
             rule whose python.profiles includes {})",
            request.profile,
            allowed.join(" or "),
            request.profile
        ));
    }
    if request.input_files > rules.max_input_files {
        return Some(format!(
            "{} input files were passed; {by} allows at most {}: pass fewer, or combine them",
            request.input_files, rules.max_input_files
        ));
    }
    if request.input_bytes > rules.max_input_bytes {
        return Some(format!(
            "the input files hold {} bytes; {by} allows at most {} bytes together: pass less \
             data, or a sample of it",
            request.input_bytes, rules.max_input_bytes
        ));
    }
    None
}
