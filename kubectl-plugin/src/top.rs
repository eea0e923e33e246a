//! `top agents`: who runs what, from the SandboxRuns stored in the cluster (finished runs stay
//! for their TTL, an hour by default): each agent's runs by phase, and their total and average
//! execution time (`status.durationMillis`), most runs first.

use std::collections::{BTreeMap, HashMap};

use anyhow::Result;
use kube::Client;
use kube::api::{Api, ListParams};
use sandboxrun_api::SandboxRun;
use sandboxrun_core::Phase;

use crate::cluster::{Doing, RUNS, explain};
use crate::term::{self, note};

/// Runs asked for per page of the list (the API server's pages keep memory flat at any count).
const PAGE: u32 = 500;

/// One agent's runs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AgentRuns {
    /// The agent (`spec.agent`).
    pub agent: String,
    /// Its runs.
    pub runs: u64,
    /// Its runs by phase (`None`: not judged yet).
    pub phases: HashMap<Option<Phase>, u64>,
    /// Execution time of the runs that report one, in milliseconds.
    pub total_millis: i64,
    /// How many runs report an execution time.
    pub timed: u64,
}

impl AgentRuns {
    fn count(&self, phases: &[Option<Phase>]) -> u64 {
        phases
            .iter()
            .map(|p| self.phases.get(p).copied().unwrap_or(0))
            .sum()
    }

    /// Average execution time of the runs that report one.
    pub fn avg_millis(&self) -> Option<i64> {
        (self.timed > 0).then(|| self.total_millis / self.timed as i64)
    }
}

/// The table's columns after AGENT and RUNS: a name and the phases it counts.
const PHASE_COLUMNS: [(&str, &[Option<Phase>]); 7] = [
    ("SUCCEEDED", &[Some(Phase::Succeeded)]),
    ("FAILED", &[Some(Phase::Failed)]),
    ("TIMEDOUT", &[Some(Phase::TimedOut)]),
    ("REJECTED", &[Some(Phase::Rejected)]),
    ("CANCELLED", &[Some(Phase::Cancelled)]),
    ("AWAITING", &[Some(Phase::AwaitingApproval)]),
    (
        "ACTIVE",
        &[None, Some(Phase::Pending), Some(Phase::Running)],
    ),
];

/// Each agent's runs, most runs first (then by name).
pub fn by_agent<'a>(runs: impl IntoIterator<Item = &'a SandboxRun>) -> Vec<AgentRuns> {
    let mut agents: BTreeMap<&str, AgentRuns> = BTreeMap::new();
    for run in runs {
        let entry = agents
            .entry(run.spec.agent.as_str())
            .or_insert_with(|| AgentRuns {
                agent: run.spec.agent.clone(),
                ..AgentRuns::default()
            });
        let status = run.status.as_ref();
        entry.runs += 1;
        *entry
            .phases
            .entry(status.and_then(|s| s.phase))
            .or_insert(0) += 1;
        if let Some(ms) = status.and_then(|s| s.duration_millis).filter(|ms| *ms >= 0) {
            entry.total_millis = entry.total_millis.saturating_add(ms);
            entry.timed += 1;
        }
    }
    let mut agents: Vec<AgentRuns> = agents.into_values().collect();
    agents.sort_by(|a, b| b.runs.cmp(&a.runs).then_with(|| a.agent.cmp(&b.agent)));
    agents
}

/// A duration for people: `850ms`, `1.2s`, `4m05s`, `2h03m`.
pub fn human_millis(ms: i64) -> String {
    let ms = ms.max(0);
    match ms {
        0..1_000 => format!("{ms}ms"),
        1_000..60_000 => format!("{}.{}s", ms / 1000, (ms % 1000) / 100),
        60_000..3_600_000 => format!("{}m{:02}s", ms / 60_000, (ms % 60_000) / 1000),
        _ => format!("{}h{:02}m", ms / 3_600_000, (ms % 3_600_000) / 60_000),
    }
}

/// The table, as kubectl prints one: a header, left-aligned columns three spaces apart.
pub fn table(agents: &[AgentRuns]) -> String {
    let mut rows: Vec<Vec<String>> = Vec::with_capacity(agents.len() + 1);
    let mut header = vec!["AGENT".to_owned(), "RUNS".to_owned()];
    header.extend(PHASE_COLUMNS.iter().map(|(name, _)| (*name).to_owned()));
    header.extend(["TOTAL".to_owned(), "AVG".to_owned()]);
    rows.push(header);
    for a in agents {
        // Escaped before the widths are measured: a name cannot break the columns, or the
        // terminal.
        let mut row = vec![term::escape(&a.agent, false), a.runs.to_string()];
        row.extend(PHASE_COLUMNS.iter().map(|(_, p)| a.count(p).to_string()));
        let (total, avg) = match a.avg_millis() {
            Some(avg) => (human_millis(a.total_millis), human_millis(avg)),
            None => ("-".to_owned(), "-".to_owned()),
        };
        row.extend([total, avg]);
        rows.push(row);
    }
    columns(&rows)
}

/// `rows` (the header first) as kubectl prints a table: left-aligned columns three spaces apart.
/// Each cell must already be escaped ([`term::escape`]), so that its width is what is printed.
pub fn columns(rows: &[Vec<String>]) -> String {
    let Some(header) = rows.first() else {
        return String::new();
    };
    let widths: Vec<usize> = (0..header.len())
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in rows {
        let last = row.len().saturating_sub(1);
        for (i, cell) in row.iter().enumerate() {
            out.push_str(cell);
            if i < last {
                let pad = widths[i] - cell.chars().count() + 3;
                out.extend(std::iter::repeat_n(' ', pad));
            }
        }
        out.push('\n');
    }
    out
}

/// Every stored run in `namespace` (`None`: all namespaces), page by page.
pub async fn list_runs(client: &Client, namespace: Option<&str>) -> Result<Vec<SandboxRun>> {
    let api: Api<SandboxRun> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let doing = Doing {
        verb: "list",
        resource: RUNS,
        namespace,
        name: None,
    };
    let mut runs = Vec::new();
    let mut lp = ListParams::default().limit(PAGE);
    loop {
        let page = api.list(&lp).await.map_err(|e| explain(e, &doing))?;
        runs.extend(page.items);
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => lp = lp.continue_token(&token),
            None => return Ok(runs),
        }
    }
}

/// `top agents`: prints the table of the runs in `namespace` (`None`: every namespace).
pub async fn agents(client: &Client, namespace: Option<&str>) -> Result<()> {
    let runs = list_runs(client, namespace).await?;
    if runs.is_empty() {
        match namespace {
            Some(ns) => note!("No SandboxRuns found in namespace {ns}."),
            None => note!("No SandboxRuns found."),
        }
        return Ok(());
    }
    term::stdout_body(&table(&by_agent(&runs)), false)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn run(agent: &str, phase: Option<&str>, duration: Option<i64>) -> SandboxRun {
        let mut status = json!({});
        if let Some(p) = phase {
            status["phase"] = json!(p);
        }
        if let Some(d) = duration {
            status["durationMillis"] = json!(d);
        }
        serde_json::from_value(json!({
            "apiVersion": "sandboxrun.dev/v1alpha1",
            "kind": "SandboxRun",
            "metadata": {"name": "r"},
            "spec": {"agent": agent, "python": {"code": "1"}},
            "status": status,
        }))
        .unwrap()
    }

    fn sample() -> Vec<SandboxRun> {
        vec![
            run("analyst-01", Some("Succeeded"), Some(1200)),
            run("bot", Some("Rejected"), None),
            run("analyst-01", Some("Failed"), Some(800)),
            run("analyst-01", Some("Running"), None),
            run("zed", Some("Succeeded"), Some(90_000)),
            run("bot", Some("AwaitingApproval"), None),
            run("analyst-01", None, None),
        ]
    }

    #[test]
    fn agents_are_counted_by_phase_most_runs_first() {
        let agents = by_agent(&sample());
        let names: Vec<&str> = agents.iter().map(|a| a.agent.as_str()).collect();
        // 4 runs, then 2, then 1; ties would go by name.
        assert_eq!(names, ["analyst-01", "bot", "zed"]);
        let analyst = &agents[0];
        assert_eq!(analyst.runs, 4);
        assert_eq!(analyst.count(&[Some(Phase::Succeeded)]), 1);
        assert_eq!(analyst.count(&[Some(Phase::Failed)]), 1);
        assert_eq!(
            analyst.count(&[None, Some(Phase::Pending), Some(Phase::Running)]),
            2
        );
        assert_eq!((analyst.total_millis, analyst.timed), (2000, 2));
        assert_eq!(analyst.avg_millis(), Some(1000));
        assert_eq!(agents[1].avg_millis(), None, "bot has no timed run");
        let tie = by_agent(&[run("b", None, None), run("a", None, None)]);
        assert_eq!(tie[0].agent, "a");
    }

    #[test]
    fn the_table_lines_up() {
        let text = table(&by_agent(&sample()));
        let expected = "\
AGENT        RUNS   SUCCEEDED   FAILED   TIMEDOUT   REJECTED   CANCELLED   AWAITING   ACTIVE   TOTAL   AVG
analyst-01   4      1           1        0          0          0           0          2        2.0s    1.0s
bot          2      0           0        0          1          0           1          0        -       -
zed          1      1           0        0          0          0           0          0        1m30s   1m30s
";
        assert_eq!(text, expected, "\n{text}");
        // An empty table is its header.
        assert_eq!(table(&[]).lines().count(), 1);
    }

    #[test]
    fn agent_names_are_escaped_and_still_line_up() {
        let agents = by_agent(&[
            run("\u{1b}]0;pwned\u{7}", None, None),
            run("ev\u{202e}il", None, None),
            run("a\rb", None, None),
        ]);
        let text = table(&agents);
        assert!(
            text.chars().all(|c| !term::is_unsafe(c) || c == '\n'),
            "{text:?}"
        );
        assert!(text.contains("\\x1b]0;pwned\\x07") && text.contains("ev\\u{202e}il"));
        // Every row has its RUNS column where the header has it.
        let at = text.lines().next().unwrap().find("RUNS").unwrap();
        for row in text.lines().skip(1) {
            assert_eq!(&row[at..at + 1], "1", "{row}");
        }
    }

    #[test]
    fn durations_for_people() {
        assert_eq!(human_millis(0), "0ms");
        assert_eq!(human_millis(850), "850ms");
        assert_eq!(human_millis(1_250), "1.2s");
        assert_eq!(human_millis(59_999), "59.9s");
        assert_eq!(human_millis(245_000), "4m05s");
        assert_eq!(human_millis(7_380_000), "2h03m");
        assert_eq!(human_millis(-5), "0ms");
    }
}
