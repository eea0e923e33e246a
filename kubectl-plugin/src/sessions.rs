//! `sessions`: the SandboxSessions of a namespace (or of all) as a table, and `sessions close
//! NAME`, which deletes one: its sandbox goes with it (owner references).

use anyhow::Result;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams};
use sandboxrun_api::{SandboxSession, SessionPhase};

use crate::cluster::{Doing, explain};
use crate::term::{self, note, say};
use crate::top::columns;

/// Sessions asked for per page of the list (the API server's pages keep memory flat at any
/// count).
const PAGE: u32 = 500;

/// What a cell says when there is nothing to say (no call yet, no expiry known).
const NONE: &str = "-";

/// A span of seconds as kubectl prints ages: `45s`, `8m10s`, `95m`, `5h12m`, `30h`, `3d4h`,
/// `12d` (negative spans count as none).
pub fn human_seconds(seconds: i64) -> String {
    let s = seconds.max(0);
    let (m, h, d) = (s / 60, s / 3_600, s / 86_400);
    let with = |big: i64, unit: &str, small: i64, small_unit: &str| {
        if small == 0 {
            format!("{big}{unit}")
        } else {
            format!("{big}{unit}{small}{small_unit}")
        }
    };
    if s < 120 {
        format!("{s}s")
    } else if m < 10 {
        with(m, "m", s % 60, "s")
    } else if h < 3 {
        format!("{m}m")
    } else if h < 8 {
        with(h, "h", m % 60, "m")
    } else if h < 48 {
        format!("{h}h")
    } else if d < 8 {
        with(d, "d", h % 24, "h")
    } else {
        format!("{d}d")
    }
}

/// How long ago `time` was, at `now`.
fn ago(time: Option<&Time>, now: Timestamp) -> String {
    time.map_or_else(
        || NONE.to_owned(),
        |t| human_seconds(now.duration_since(t.0).as_secs()),
    )
}

/// When a session that has not ended expires, as seen at `now`: `in 8m10s`, or `now` once that
/// time has passed (the operator ends it at its next look).
fn expires(session: &SandboxSession, now: Timestamp) -> String {
    let status = session.status.as_ref();
    if status.is_some_and(|s| s.ended()) {
        return NONE.to_owned();
    }
    match status.and_then(|s| s.expiry_time.as_ref()) {
        None => NONE.to_owned(),
        Some(t) => {
            let left = t.0.duration_since(now).as_secs();
            if left <= 0 {
                "now".to_owned()
            } else {
                format!("in {}", human_seconds(left))
            }
        }
    }
}

/// The table of `sessions` at `now`, as kubectl prints one, with a NAMESPACE column first when
/// they come from every namespace. Sessions are listed by namespace, then name.
pub fn table(sessions: &[SandboxSession], now: Timestamp, all_namespaces: bool) -> String {
    let mut sorted: Vec<&SandboxSession> = sessions.iter().collect();
    sorted.sort_by(|a, b| {
        (&a.metadata.namespace, &a.metadata.name).cmp(&(&b.metadata.namespace, &b.metadata.name))
    });
    let mut rows: Vec<Vec<String>> = Vec::with_capacity(sessions.len() + 1);
    let header = [
        "NAME",
        "AGENT",
        "PROFILE",
        "PHASE",
        "CALLS",
        "LAST CALL",
        "EXPIRES",
        "AGE",
    ];
    let mut first = Vec::new();
    if all_namespaces {
        first.push("NAMESPACE".to_owned());
    }
    first.extend(header.iter().map(|h| (*h).to_owned()));
    rows.push(first);
    for s in sorted {
        let status = s.status.as_ref();
        let mut row = Vec::with_capacity(rows[0].len());
        if all_namespaces {
            row.push(term::escape(
                s.metadata.namespace.as_deref().unwrap_or_default(),
                false,
            ));
        }
        // Escaped before the widths are measured: what an agent or a direct creator wrote
        // cannot break the columns, or the terminal.
        row.extend([
            term::escape(s.metadata.name.as_deref().unwrap_or_default(), false),
            term::escape(&s.spec.agent, false),
            s.spec.sandbox_profile().as_str().to_owned(),
            status
                .and_then(|st| st.phase)
                .map_or(NONE, SessionPhase::as_str)
                .to_owned(),
            status.and_then(|st| st.calls).unwrap_or(0).to_string(),
            ago(status.and_then(|st| st.last_call_time.as_ref()), now),
            expires(s, now),
            ago(s.metadata.creation_timestamp.as_ref(), now),
        ]);
        rows.push(row);
    }
    columns(&rows)
}

/// Every SandboxSession in `namespace` (`None`: all namespaces), page by page.
async fn list(client: &Client, namespace: Option<&str>) -> Result<Vec<SandboxSession>> {
    let api: Api<SandboxSession> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let doing = Doing::sessions("list", namespace, None);
    let mut sessions = Vec::new();
    let mut lp = ListParams::default().limit(PAGE);
    loop {
        let page = api.list(&lp).await.map_err(|e| explain(e, &doing))?;
        sessions.extend(page.items);
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => lp = lp.continue_token(&token),
            None => return Ok(sessions),
        }
    }
}

/// `sessions`: prints the table of the sessions in `namespace` (`None`: every namespace).
pub async fn show(client: &Client, namespace: Option<&str>) -> Result<()> {
    let sessions = list(client, namespace).await?;
    if sessions.is_empty() {
        match namespace {
            Some(ns) => note!("No SandboxSessions found in namespace {ns}."),
            None => note!("No SandboxSessions found."),
        }
        return Ok(());
    }
    term::stdout_body(
        &table(&sessions, Timestamp::now(), namespace.is_none()),
        false,
    )?;
    Ok(())
}

/// `sessions close NAME`: deletes the session (the operator then ends it and deletes its sandbox).
pub async fn close(client: &Client, namespace: &str, name: &str) -> Result<()> {
    let api: Api<SandboxSession> = Api::namespaced(client.clone(), namespace);
    let doing = Doing::sessions("delete", Some(namespace), Some(name));
    api.delete(name, &DeleteParams::default())
        .await
        .map_err(|e| explain(e, &doing))?;
    say!("sandboxsession {name} closed");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    const NOW: &str = "2026-12-05T09:00:00Z";

    fn now() -> Timestamp {
        NOW.parse().unwrap()
    }

    fn session(name: &str, agent: &str, spec: Value, status: Value) -> SandboxSession {
        let mut full = json!({"agent": agent});
        full.as_object_mut()
            .unwrap()
            .extend(spec.as_object().unwrap().clone());
        serde_json::from_value(json!({
            "apiVersion": "sandboxrun.dev/v1alpha1",
            "kind": "SandboxSession",
            "metadata": {"name": name, "namespace": "runs", "creationTimestamp": "2026-12-05T08:30:00Z"},
            "spec": full,
            "status": status,
        }))
        .unwrap()
    }

    fn sample() -> Vec<SandboxSession> {
        vec![
            session(
                "s-b",
                "analyst-01",
                json!({"profile": "data"}),
                json!({"phase": "Busy", "calls": 12, "lastCallTime": "2026-12-05T08:58:10Z",
                       "expiryTime": "2026-12-05T09:08:10Z"}),
            ),
            session("s-a", "bot", json!({}), json!({"phase": "Pending"})),
            session(
                "s-c",
                "bot",
                json!({}),
                json!({"phase": "Ended", "calls": 1, "endReason": "IdleTimeout",
                       "lastCallTime": "2026-12-05T08:40:00Z", "expiryTime": "2026-12-05T08:50:00Z"}),
            ),
            session(
                "s-d",
                "late",
                json!({}),
                json!({"phase": "Ready", "expiryTime": "2026-12-05T08:59:00Z"}),
            ),
        ]
    }

    #[test]
    fn the_table_lines_up_by_name() {
        let text = table(&sample(), now(), false);
        let expected = "\
NAME   AGENT        PROFILE   PHASE     CALLS   LAST CALL   EXPIRES    AGE
s-a    bot          minimal   Pending   0       -           -          30m
s-b    analyst-01   data      Busy      12      110s        in 8m10s   30m
s-c    bot          minimal   Ended     1       20m         -          30m
s-d    late         minimal   Ready     0       -           now        30m
";
        assert_eq!(text, expected, "\n{text}");
        // No sessions: the header alone.
        assert_eq!(table(&[], now(), false).lines().count(), 1);
    }

    #[test]
    fn all_namespaces_adds_the_namespace_first() {
        let mut other = session("s-0", "x", json!({}), json!({}));
        other.metadata.namespace = Some("a-team".into());
        let mut sessions = sample();
        sessions.push(other);
        let text = table(&sessions, now(), true);
        let mut lines = text.lines();
        assert!(
            lines
                .next()
                .unwrap()
                .starts_with("NAMESPACE   NAME   AGENT"),
            "{text}"
        );
        // Sorted by namespace first; a session without a status has no phase yet.
        assert_eq!(
            lines.next().unwrap(),
            "a-team      s-0    x            minimal   -         0       -           -          30m"
        );
        assert!(
            lines.next().unwrap().starts_with("runs        s-a "),
            "{text}"
        );
    }

    #[test]
    fn agent_names_are_escaped_and_still_line_up() {
        let sessions = [
            session("s-1", "\u{1b}]0;pwned\u{7}", json!({}), json!({})),
            session("s-2", "ev\u{202e}il", json!({}), json!({})),
        ];
        let text = table(&sessions, now(), false);
        assert!(
            text.chars().all(|c| !term::is_unsafe(c) || c == '\n'),
            "{text:?}"
        );
        assert!(text.contains("\\x1b]0;pwned\\x07") && text.contains("ev\\u{202e}il"));
        let at = text.lines().next().unwrap().find("PROFILE").unwrap();
        for row in text.lines().skip(1) {
            assert_eq!(&row[at..at + 7], "minimal", "{row}");
        }
    }

    #[test]
    fn ages_for_people() {
        for (seconds, text) in [
            (-5, "0s"),
            (0, "0s"),
            (45, "45s"),
            (119, "119s"),
            (120, "2m"),
            (490, "8m10s"),
            (600, "10m"),
            (5_700, "95m"),
            (10_800, "3h"),
            (18_720, "5h12m"),
            (108_000, "30h"),
            (273_600, "3d4h"),
            (1_036_800, "12d"),
        ] {
            assert_eq!(human_seconds(seconds), text, "{seconds}");
        }
    }
}
