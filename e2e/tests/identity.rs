//! Who a run is for cannot be made up (the chart's ValidatingAdmissionPolicy,
//! `templates/admission-policy.yaml`), tested as a service account that has every right on
//! SandboxRuns in the sandbox namespace but is neither the frontend nor a cluster admin: it may
//! create runs only as itself and only in the sandbox environment, and it cannot approve (or
//! deny) its own run, while a person may, recording their own name as the one who decided.

// Tests state what they expect with unwrap and expect: a failure is the message.
#![allow(clippy::unwrap_used)]

use anyhow::{Result, bail, ensure};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, Error};
use sandboxrun_core::{Environment, Phase};
use sandboxrun_e2e::identity::{client_as, run_account, whoami};
use sandboxrun_e2e::runs::{RUNS_NAMESPACE, python_run, runs};
use sandboxrun_e2e::{client, unique_name};
use serde_json::json;

/// A service account in the sandbox namespace with full rights on SandboxRuns there (removed
/// with its Role and binding by [`remove_creator`] at the end of the test).
async fn run_creator(admin: &Client, name: &str) -> Result<Client> {
    run_account(
        admin,
        RUNS_NAMESPACE,
        name,
        &[
            "create", "get", "list", "watch", "patch", "update", "delete",
        ],
    )
    .await
}

async fn remove_creator(admin: &Client, name: &str) {
    let dp = DeleteParams::default();
    let _ = Api::<RoleBinding>::namespaced(admin.clone(), RUNS_NAMESPACE)
        .delete(name, &dp)
        .await;
    let _ = Api::<Role>::namespaced(admin.clone(), RUNS_NAMESPACE)
        .delete(name, &dp)
        .await;
    let _ = Api::<ServiceAccount>::namespaced(admin.clone(), RUNS_NAMESPACE)
        .delete(name, &dp)
        .await;
}

/// The run of `agent`, as `creator` would send it.
fn run_of(agent: &str) -> sandboxrun_api::SandboxRun {
    python_run("e2e-identity", "print(1)", json!({"agent": agent}))
}

/// The API error of a refused write, or a failure when it was admitted.
fn refused<T: std::fmt::Debug>(result: Result<T, Error>, what: &str) -> Result<String> {
    match result {
        Err(Error::Api(e)) if e.code == 403 || e.code == 422 => Ok(e.message),
        Err(e) => bail!("{what}: unexpected error {e}"),
        Ok(v) => bail!("{what} was admitted: {v:?}"),
    }
}

#[tokio::test]
async fn runs_record_their_creator_and_an_agent_cannot_approve_its_own_run() -> Result<()> {
    let admin = client().await?;
    let name = unique_name("e2e-creator");
    let me = format!("system:serviceaccount:{RUNS_NAMESPACE}:{name}");
    let creator = run_creator(&admin, &name).await?;
    let outcome = async {
        // Any other agent, a look-alike of the frontend's agents, or an empty-looking one: no.
        for agent in [
            "analyst-01",
            "e2e-agent",
            "system:serviceaccount:x:y",
            &me.to_uppercase(),
        ] {
            let message = refused(
                runs(&creator)
                    .create(&PostParams::default(), &run_of(agent))
                    .await,
                &format!("a run for {agent} created by {me}"),
            )?;
            ensure!(
                message.contains("spec.agent must be your own identity"),
                "{message}"
            );
        }
        // As itself, but in an environment other than identity.directEnvironments (sandbox):
        // no, whatever the environment's rules would say.
        for (environment, name) in [
            (Environment::Staging, "staging"),
            (Environment::Production, "production"),
        ] {
            let mut run = run_of(&me);
            run.spec.environment = environment;
            let message = refused(
                runs(&creator).create(&PostParams::default(), &run).await,
                &format!("a {name} run created directly by {me}"),
            )?;
            ensure!(
                message.contains(&format!("spec.environment {name} is not open to {me}")),
                "{message}"
            );
        }
        // As itself: admitted.
        runs(&creator)
            .create(&PostParams::default(), &run_of(&me))
            .await?;
        // A run of its own that waits for a person (production, which policy escalates; created
        // by the admin, since the creator may target only the sandbox): an approval is written
        // only while a run waits, so the identity rules below are what refuses it.
        let mut escalated = run_of(&me);
        escalated.spec.environment = Environment::Production;
        let waiting = runs(&admin)
            .create(&PostParams::default(), &escalated)
            .await?;
        let run_name = waiting.metadata.name.clone().unwrap_or_default();
        sandboxrun_e2e::runs::wait_for(
            &admin,
            &run_name,
            std::time::Duration::from_secs(60),
            |p| p == Phase::AwaitingApproval,
        )
        .await?;
        // Its own approval (or denial), whatever the patch looks like: refused.
        for approved in [true, false] {
            let patch = json!({"spec": {"approval": {"approved": approved, "by": me}}});
            let message = refused(
                runs(&creator)
                    .patch(&run_name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await,
                &format!("{me} setting approved={approved} on its own run"),
            )?;
            ensure!(message.contains("cannot approve or deny it"), "{message}");
        }
        // A person (here the cluster admin) may decide, and the approval records who did: it
        // must name the writer, not someone else, nobody, or a look-alike.
        let person = whoami(&admin).await?;
        for by in [
            "someone-else".to_owned(),
            me.clone(),
            person.to_uppercase(),
            format!("{person} "),
        ] {
            let patch = json!({"spec": {"approval": {"approved": true, "by": by}}});
            let message = refused(
                runs(&admin)
                    .patch(&run_name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await,
                &format!("{person} recording the approval as {by:?}"),
            )?;
            ensure!(
                message.contains("spec.approval.by must be your own identity"),
                "{message}"
            );
        }
        let unnamed = json!({"spec": {"approval": {"approved": true}}});
        let message = refused(
            runs(&admin)
                .patch(&run_name, &PatchParams::default(), &Patch::Merge(&unnamed))
                .await,
            "an approval that names nobody",
        )?;
        ensure!(message.contains("by"), "{message}");
        let patch = json!({"spec": {"approval": {"approved": false, "by": person}}});
        runs(&admin)
            .patch(&run_name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        // The frontend's own identity may record its callers' agents (it is the trusted one),
        // checked with a server-side dry run.
        let frontend = client_as(
            &admin,
            sandboxrun_e2e::runs::SYSTEM_NAMESPACE,
            "sandboxrun-mcp",
        )
        .await?;
        runs(&frontend)
            .create(
                &PostParams {
                    dry_run: true,
                    ..Default::default()
                },
                &run_of("analyst-01"),
            )
            .await?;
        let _ = runs(&admin)
            .delete(&run_name, &DeleteParams::background())
            .await;
        Ok(())
    }
    .await;
    remove_creator(&admin, &name).await;
    outcome
}

/// The frontend cancels the runs of calls that went away (`spec.cancelled`), which then end
/// `Cancelled` with no Pod left; it may change nothing else (not the approval, not the metadata),
/// not on a run someone else created, not on a finished run (the audit trail), and it deletes
/// nothing.
#[tokio::test]
async fn the_frontend_only_cancels_the_unfinished_runs_it_created() -> Result<()> {
    let admin = client().await?;
    let frontend = client_as(
        &admin,
        sandboxrun_e2e::runs::SYSTEM_NAMESPACE,
        "sandboxrun-mcp",
    )
    .await?;
    let dry = PatchParams {
        dry_run: true,
        ..PatchParams::default()
    };
    let cancel = json!({"spec": {"cancelled": true}});
    let long = |agent: &str| {
        python_run(
            "e2e-cancel",
            "import time\ntime.sleep(120)",
            json!({"agent": agent}),
        )
    };
    // A run of someone else (no frontend label).
    let foreign = runs(&admin)
        .create(&PostParams::default(), &long("someone-else"))
        .await?;
    let foreign_name = foreign.metadata.name.clone().unwrap_or_default();
    let message = refused(
        runs(&frontend)
            .patch(&foreign_name, &dry, &Patch::Merge(&cancel))
            .await,
        "the frontend cancelling a run it did not create",
    )?;
    ensure!(message.contains("may only cancel"), "{message}");
    refused(
        runs(&frontend)
            .delete(
                &foreign_name,
                &DeleteParams {
                    dry_run: true,
                    ..DeleteParams::background()
                },
            )
            .await,
        "the frontend deleting a run",
    )?;
    // One labelled as the frontend's.
    let mut own = long("someone-else");
    own.metadata.labels = Some(
        [(
            "app.kubernetes.io/created-by".to_owned(),
            "sandboxrun-mcp".to_owned(),
        )]
        .into(),
    );
    let own = runs(&admin).create(&PostParams::default(), &own).await?;
    let own_name = own.metadata.name.clone().unwrap_or_default();
    sandboxrun_e2e::runs::wait_for(
        &admin,
        &own_name,
        std::time::Duration::from_secs(120),
        |p| p == Phase::Running,
    )
    .await?;
    // Anything but the cancellation: refused, even on its own run.
    for (what, patch) in [
        (
            "approving it",
            json!({"spec": {"approval": {"approved": true, "by": "system:serviceaccount:sandboxrun-system:sandboxrun-mcp"}}}),
        ),
        (
            "relabelling it",
            json!({"metadata": {"labels": {"team": "x"}}}),
        ),
        (
            "adding a finalizer",
            json!({"metadata": {"finalizers": ["example.com/keep"]}}),
        ),
    ] {
        let message = refused(
            runs(&frontend)
                .patch(&own_name, &dry, &Patch::Merge(&patch))
                .await,
            &format!("the frontend {what}"),
        )?;
        // Refused by the identity policy, or, for an approval of a run that does not wait for
        // one, already by the schema.
        ensure!(
            message.contains("may only cancel")
                || message.contains("only while the run awaits approval"),
            "{what}: {message}"
        );
    }
    // The cancellation: the run ends Cancelled, its sandbox goes.
    runs(&frontend)
        .patch(&own_name, &PatchParams::default(), &Patch::Merge(&cancel))
        .await?;
    let done =
        sandboxrun_e2e::runs::wait_terminal(&admin, &own_name, std::time::Duration::from_secs(60))
            .await?;
    let status = done.status.clone().unwrap_or_default();
    ensure!(
        status.phase == Some(Phase::Cancelled) && status.reason.as_deref() == Some("CallCancelled"),
        "{status:?}"
    );
    sandboxrun_e2e::runs::wait_no_pods(&admin, &own_name, std::time::Duration::from_secs(60))
        .await?;
    // Once cancelled, it stays so; once finished, not even the frontend's own run is touched.
    let message = refused(
        runs(&admin)
            .patch(
                &own_name,
                &dry,
                &Patch::Merge(&json!({"spec": {"cancelled": false}})),
            )
            .await,
        "un-cancelling a run",
    )?;
    ensure!(
        message.contains("a cancelled run stays cancelled"),
        "{message}"
    );
    let message = refused(
        runs(&frontend)
            .patch(&own_name, &dry, &Patch::Merge(&cancel))
            .await,
        "the frontend touching a finished run",
    )?;
    ensure!(message.contains("may only cancel"), "{message}");
    for name in [foreign_name, own_name] {
        let _ = runs(&admin)
            .delete(&name, &DeleteParams::background())
            .await;
    }
    Ok(())
}
