use super::*;

const NS: &str = "runs";

fn at(seconds: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + seconds).unwrap()
}

fn run(name: &str) -> ObjectRef<SandboxRun> {
    ObjectRef::new(name).within(NS)
}

/// The most a run holds a sandbox, in most tests: short, so the bound used before the queue can
/// tell its pace lets every run of a test about something else in.
const LONGEST: Duration = Duration::from_secs(1);

/// Run `name` of `agent` asks at `now`, not queued before.
fn ask(admission: &Admission, name: &str, agent: &str, now: Timestamp) -> Ask {
    admission.ask(&run(name), name, agent, None, LONGEST, None, now)
}

/// Run `uid` got a sandbox of its own that a node runs (at once): a cold one, whose hold
/// teaches the queue its pace.
fn on_a_node(admission: &Admission, run: &ObjectRef<SandboxRun>, uid: &str, now: Timestamp) {
    admission.admitted(run, uid, COLD, now);
    admission.scheduling(run, uid, Placement::Placed, now);
}

/// A sandbox of its own, for tests that do not weigh the room.
const COLD: Sandbox<'static> = Sandbox::Created("a-pod");

fn position(ask: &Ask) -> u32 {
    match ask {
        Ask::Wait(place) => place.position,
        Ask::Head => 1,
        other => panic!("not waiting: {other:?}"),
    }
}

#[test]
fn with_nobody_waiting_a_run_asks_at_once() {
    let admission = Admission::new(Duration::from_secs(60));
    assert_eq!(ask(&admission, "a1", "a", at(0)), Ask::Go);
    assert_eq!(ask(&admission, "a2", "a", at(0)), Ask::Go);
}

#[test]
fn a_run_the_quota_refused_heads_the_queue_and_later_runs_wait_behind_it() {
    let admission = Admission::new(Duration::from_secs(60));
    let Ask::Wait(place) = admission.no_room(&run("a1"), "a1", "a", None, LONGEST, at(0)) else {
        panic!("not waiting")
    };
    assert_eq!((place.position, place.since), (1, at(0)));
    // Nobody overtakes it: a new run waits even though it has not tried.
    assert_eq!(position(&ask(&admission, "b1", "b", at(1))), 2);
    assert_eq!(
        admission.ask(&run("a1"), "a1", "a", Some(at(0)), LONGEST, None, at(1)),
        Ask::Head
    );
}

#[test]
fn agents_take_turns_however_many_runs_each_has_waiting() {
    let admission = Admission::new(Duration::from_secs(600));
    admission.no_room(&run("a1"), "a1", "a", None, LONGEST, at(0));
    for (i, name) in ["a2", "a3", "a4"].into_iter().enumerate() {
        ask(&admission, name, "a", at(1 + i as i64));
    }
    // Within the time the queue needs to know its rate: nobody is refused for it.
    ask(&admission, "b1", "b", at(4));
    ask(&admission, "b2", "b", at(4));
    let positions: Vec<(String, u32)> = ["a1", "a2", "a3", "a4", "b1", "b2"]
        .into_iter()
        .map(|name| {
            let agent = &name[..1];
            let p = admission.ask(&run(name), name, agent, Some(at(0)), LONGEST, None, at(4));
            (name.to_owned(), position(&p))
        })
        .collect();
    // a1 b1 a2 b2 a3 a4: b's runs came after a's four, and still go second and fourth.
    let expected = [
        ("a1", 1),
        ("a2", 3),
        ("a3", 5),
        ("a4", 6),
        ("b1", 2),
        ("b2", 4),
    ];
    for (name, want) in expected {
        let got = positions.iter().find(|(n, _)| n == name).unwrap().1;
        assert_eq!(got, want, "{name}: {positions:?}");
    }
}

/// The uids of the queue in order, as each run would be told its place now.
fn order_of(admission: &Admission, names: &[&str], now: Timestamp) -> Vec<String> {
    let mut placed: Vec<(u32, String)> = names
        .iter()
        .map(|name| {
            let agent = &name[..1];
            let p = admission.ask(&run(name), name, agent, Some(at(0)), LONGEST, None, now);
            (position(&p), (*name).to_owned())
        })
        .collect();
    placed.sort();
    placed.into_iter().map(|(_, name)| name).collect()
}

#[test]
fn turns_alternate_as_runs_are_admitted_not_only_on_arrival() {
    // Found on the cluster: ranked only among the runs still waiting, the heavy agent's next run
    // was older than the light agent's first and went ahead of it after every admission.
    let admission = Admission::new(Duration::from_secs(600));
    admission.no_room(&run("a1"), "a1", "a", None, LONGEST, at(0));
    for name in ["a2", "a3", "a4"] {
        ask(&admission, name, "a", at(1));
    }
    ask(&admission, "b1", "b", at(2));
    ask(&admission, "b2", "b", at(2));
    let all = ["a1", "a2", "a3", "a4", "b1", "b2"];
    assert_eq!(
        order_of(&admission, &all, at(3)),
        ["a1", "b1", "a2", "b2", "a3", "a4"]
    );
    on_a_node(&admission, &run("a1"), "a1", at(3));
    let rest = ["a2", "a3", "a4", "b1", "b2"];
    assert_eq!(
        order_of(&admission, &rest, at(3)),
        ["b1", "a2", "b2", "a3", "a4"]
    );
    on_a_node(&admission, &run("b1"), "b1", at(4));
    // A third agent arriving now takes the next round's turn: after a2 and b2, before a3.
    ask(&admission, "c1", "c", at(4));
    let rest = ["a2", "a3", "a4", "b2", "c1"];
    assert_eq!(
        order_of(&admission, &rest, at(4)),
        ["a2", "b2", "c1", "a3", "a4"]
    );
    // A run that leaves without a sandbox gives up its agent's last turn, not its place.
    admission.ended(&run("a3"), "a3", at(4));
    let rest = ["a2", "a4", "b2", "c1"];
    assert_eq!(order_of(&admission, &rest, at(4)), ["a2", "b2", "c1", "a4"]);
}

#[test]
fn the_next_head_is_woken_when_the_head_gets_a_sandbox_or_a_run_ends() {
    let admission = Admission::new(Duration::from_secs(60));
    let wakeups = admission.wakeups();
    futures::pin_mut!(wakeups);
    let mut next =
        || futures::FutureExt::now_or_never(futures::StreamExt::next(&mut wakeups)).flatten();
    admission.no_room(&run("a1"), "a1", "a", None, LONGEST, at(0));
    ask(&admission, "b1", "b", at(0));
    ask(&admission, "c1", "c", at(1));
    on_a_node(&admission, &run("a1"), "a1", at(2));
    assert_eq!(next().unwrap(), run("b1"));
    // A run holding a sandbox ends: the head (still b1) asks again.
    admission.ended(&run("x"), "x", at(3));
    assert_eq!(next().unwrap(), run("b1"));
    admission.ended(&run("b1"), "b1", at(3));
    assert_eq!(next().unwrap(), run("c1"));
    on_a_node(&admission, &run("c1"), "c1", at(4));
    assert!(next().is_none(), "nobody left to wake");
    // The queue is empty again: the next run goes straight on.
    assert_eq!(ask(&admission, "d1", "d", at(5)), Ask::Go);
}

/// A queue that admits one run a second for 20 s, with `waiting` runs behind its head.
fn busy_queue(allowance: u64, waiting: usize) -> Admission {
    let admission = Admission::new(Duration::from_secs(allowance));
    admission.no_room(&run("head"), "head", "h", None, LONGEST, at(0));
    for i in 0..waiting {
        let name = format!("w{i}");
        admission.ask(&run(&name), &name, &name, None, LONGEST, None, at(0));
    }
    for s in 1..=20 {
        let name = format!("served{s}");
        admission.no_room(&run(&name), &name, &name, None, LONGEST, at(s));
        on_a_node(&admission, &run(&name), &name, at(s));
        // One sandbox, each held for a second.
        let before = format!("served{}", s - 1);
        admission.ended(&run(&before), &before, at(s));
        // The waiting runs are reconciled meanwhile, which keeps their places.
        admission.ask(&run("head"), "head", "h", Some(at(0)), LONGEST, None, at(s));
        for i in 0..waiting {
            let name = format!("w{i}");
            admission.ask(&run(&name), &name, &name, Some(at(0)), LONGEST, None, at(s));
        }
    }
    admission
}

#[test]
fn a_run_that_cannot_start_within_its_allowance_is_refused_at_once_with_a_hint() {
    // 100 runs ahead at one a second: about 100 s, more than the 60 s allowed.
    let admission = busy_queue(60, 99);
    let refused = ask(&admission, "late", "z", at(20));
    let Ask::Refuse(refusal) = refused else {
        panic!("not refused: {refused:?}")
    };
    assert_eq!(refusal.position, 101);
    let expected = refusal.expected.expect("the rate is known").as_secs();
    assert!((90..=110).contains(&expected), "{expected}");
    // Retry once the queue should have shrunk to well within the allowance.
    assert!(
        (60..=80).contains(&refusal.retry_after_seconds),
        "{refusal:?}"
    );
    let message = refusal.message(Duration::from_secs(60));
    assert!(message.contains("100 runs wait"), "{message}");
    assert!(message.contains("retry in"), "{message}");
    // Refused runs do not stay in the queue: the next one is refused at the same place.
    let Ask::Refuse(next) = ask(&admission, "next", "y", at(20)) else {
        panic!("not refused")
    };
    assert_eq!(next.position, 101, "the refused run holds no place");
}

#[test]
fn runs_refused_in_one_moment_are_told_to_come_back_one_pace_apart() {
    // 100 runs ahead at one a second: each late run is refused at the same place.
    let admission = busy_queue(60, 99);
    let hints: Vec<u32> = (0..5)
        .map(
            |i| match ask(&admission, &format!("late-{i}"), "z", at(20)) {
                Ask::Refuse(refusal) => refusal.retry_after_seconds,
                other => panic!("not refused: {other:?}"),
            },
        )
        .collect();
    // Told one second apart (the queue admits one a second), not all the same second: they
    // come back as the queue would have served them, not as a burst.
    for pair in hints.windows(2) {
        assert_eq!(pair[1], pair[0] + 1, "{hints:?}");
    }
    // Once the moments told have passed, a run refused is told what the queue says.
    let mut queue = Queue::default();
    let (second, minute) = (Duration::from_secs(1), Duration::from_secs(60));
    assert_eq!(
        queue.book_retry(10 * second, second, minute, at(0)),
        10 * second
    );
    assert_eq!(
        queue.book_retry(10 * second, second, minute, at(0)),
        11 * second
    );
    assert_eq!(
        queue.book_retry(10 * second, second, minute, at(30)),
        10 * second
    );
    // Never later than the last resort: a burst of hundreds is told at most that.
    let admission = busy_queue(60, 99);
    let most = (0..200)
        .map(
            |i| match ask(&admission, &format!("many-{i}"), "z", at(20)) {
                Ask::Refuse(refusal) => refusal.retry_after_seconds,
                other => panic!("not refused: {other:?}"),
            },
        )
        .max();
    assert_eq!(most, Some(120));
}

#[test]
fn a_run_the_queue_can_serve_in_time_waits_with_its_expected_wait() {
    let admission = busy_queue(60, 9);
    let Ask::Wait(place) = ask(&admission, "soon", "z", at(20)) else {
        panic!("not waiting")
    };
    assert_eq!(place.position, 11);
    let expected = place.expected.unwrap().as_secs();
    assert!((8..=12).contains(&expected), "{expected}");
}

#[test]
fn an_accepted_run_waits_past_its_allowance_and_is_refused_only_as_a_last_resort() {
    let admission = Admission::new(Duration::from_secs(30));
    admission.no_room(&run("head"), "head", "h", None, LONGEST, at(0));
    assert!(matches!(
        ask(&admission, "w", "w", at(0)),
        Ask::Wait(Place { position: 2, .. })
    ));
    // Reconciled every few seconds while it waits; nobody is admitted, and it was accepted: it
    // is not refused at the end of its allowance.
    for s in (2..60).step_by(2) {
        admission.ask(&run("head"), "head", "h", Some(at(0)), LONGEST, None, at(s));
        let again = admission.ask(&run("w"), "w", "w", Some(at(0)), LONGEST, None, at(s));
        assert!(matches!(again, Ask::Wait(_)), "{s}: {again:?}");
    }
    // At twice the allowance the queue has not moved for a minute: a rate of zero.
    let Ask::Refuse(refusal) =
        admission.ask(&run("w"), "w", "w", Some(at(0)), LONGEST, None, at(60))
    else {
        panic!("not refused")
    };
    assert!(refusal.last_resort);
    assert_eq!(refusal.expected, None);
    assert_eq!(refusal.retry_after_seconds, 30);
    let message = refusal.message(Duration::from_secs(30));
    assert!(message.contains("waited 60 s"), "{message}");
}

#[test]
fn a_run_that_is_gone_stops_holding_the_head() {
    let admission = Admission::new(Duration::from_secs(600));
    admission.no_room(&run("gone"), "gone", "a", None, LONGEST, at(0));
    assert_eq!(position(&ask(&admission, "b1", "b", at(1))), 2);
    // b1 keeps being reconciled; the deleted run does not.
    for s in [10, 20, 29] {
        let asked = admission.ask(&run("b1"), "b1", "b", Some(at(1)), LONGEST, None, at(s));
        assert_eq!(position(&asked), 2, "{s}: not lapsed yet");
    }
    assert_eq!(
        admission.ask(&run("b1"), "b1", "b", Some(at(1)), LONGEST, None, at(31)),
        Ask::Head
    );
}

#[test]
fn after_a_restart_waiting_runs_take_their_recorded_places() {
    let admission = Admission::new(Duration::from_secs(600));
    // Reconciled in any order: the recorded times decide.
    let second = admission.ask(&run("r2"), "r2", "b", Some(at(5)), LONGEST, None, at(100));
    assert_eq!(second, Ask::Head, "alone so far");
    let first = admission.ask(&run("r1"), "r1", "a", Some(at(2)), LONGEST, None, at(100));
    assert_eq!(first, Ask::Head);
    assert_eq!(
        position(&admission.ask(&run("r2"), "r2", "b", Some(at(5)), LONGEST, None, at(100))),
        2
    );
}

#[test]
fn queues_of_different_namespaces_are_separate() {
    let admission = Admission::new(Duration::from_secs(60));
    admission.no_room(&run("a1"), "a1", "a", None, LONGEST, at(0));
    let other = ObjectRef::new("o1").within("elsewhere");
    assert_eq!(
        admission.ask(&other, "o1", "a", None, LONGEST, None, at(0)),
        Ask::Go
    );
}

#[test]
fn sandboxes_held_now_tell_the_rate_before_the_queue_has_admitted_anyone() {
    let admission = Admission::new(Duration::from_secs(60));
    // Ten runs got sandboxes at once; five of them held theirs for 10 s.
    for i in 0..10 {
        let name = format!("r{i}");
        assert_eq!(ask(&admission, &name, &name, at(0)), Ask::Go);
        on_a_node(&admission, &run(&name), &name, at(0));
    }
    for i in 0..5 {
        let name = format!("r{i}");
        admission.ended(&run(&name), &name, at(10));
    }
    // The other five free theirs at about one every 2 s: a queue of 40 would wait ~80 s.
    admission.no_room(&run("head"), "head", "h", None, LONGEST, at(10));
    for i in 0..38 {
        let name = format!("w{i}");
        ask(&admission, &name, &name, at(10));
    }
    // Refused on arrival a moment later, long before the queue could measure its own pace.
    let Ask::Refuse(refusal) = ask(&admission, "late", "z", at(11)) else {
        panic!("not refused")
    };
    let expected = refusal
        .expected
        .expect("known from the sandboxes held")
        .as_secs();
    assert!((70..=90).contains(&expected), "{expected}");
    // A short queue waits.
    let fresh = Admission::new(Duration::from_secs(60));
    assert_eq!(ask(&fresh, "x", "x", at(0)), Ask::Go);
    on_a_node(&fresh, &run("x"), "x", at(0));
    fresh.ended(&run("x"), "x", at(4));
    on_a_node(&fresh, &run("y"), "y", at(4));
    fresh.no_room(&run("h"), "h", "h", None, LONGEST, at(5));
    assert!(matches!(ask(&fresh, "z", "z", at(5)), Ask::Wait(_)));
}

#[test]
fn while_a_sandbox_waits_for_a_node_everyone_else_waits_in_the_queue() {
    let admission = Admission::new(Duration::from_secs(600));
    let wakeups = admission.wakeups();
    futures::pin_mut!(wakeups);
    let mut next =
        || futures::FutureExt::now_or_never(futures::StreamExt::next(&mut wakeups)).flatten();
    assert_eq!(ask(&admission, "a1", "a", at(0)), Ask::Go);
    admission.admitted(&run("a1"), "a1", COLD, at(0));
    // The quota let a1's Pod in, but no node has room for it.
    admission.scheduling(&run("a1"), "a1", Placement::Unschedulable, at(1));
    assert!(matches!(
        ask(&admission, "b1", "b", at(1)),
        Ask::Wait(Place { position: 1, .. })
    ));
    assert!(matches!(
        ask(&admission, "c1", "c", at(1)),
        Ask::Wait(Place { position: 2, .. })
    ));
    // Placed: the head asks now.
    admission.scheduling(&run("a1"), "a1", Placement::Placed, at(2));
    assert_eq!(next(), Some(run("b1")));
    assert_eq!(
        admission.ask(&run("b1"), "b1", "b", Some(at(1)), LONGEST, None, at(2)),
        Ask::Head
    );
}

#[test]
fn runs_waiting_for_a_node_go_first_and_free_nothing() {
    let admission = Admission::new(Duration::from_secs(60));
    // The quota let 20 sandboxes in at once; the node has room for 3.
    for i in 0..20 {
        let name = format!("r{i:02}");
        assert_eq!(ask(&admission, &name, &name, at(0)), Ask::Go);
        admission.admitted(&run(&name), &name, COLD, at(0));
    }
    for i in 0..3 {
        let name = format!("r{i:02}");
        admission.scheduling(&run(&name), &name, Placement::Placed, at(0));
    }
    for i in 3..20 {
        let name = format!("r{i:02}");
        admission.scheduling(&run(&name), &name, Placement::Unschedulable, at(1));
    }
    // The 3 end after 5 s, and a node takes 3 of the 17 that waited.
    for i in 0..3 {
        let name = format!("r{i:02}");
        admission.ended(&run(&name), &name, at(5));
    }
    for i in 3..6 {
        let name = format!("r{i:02}");
        admission.scheduling(&run(&name), &name, Placement::Placed, at(5));
    }
    // 3 sandboxes running, each held 5 s: 0.6 a second, with 14 Pods still ahead of the queue.
    let mut waiting = 0;
    let refusal = loop {
        let name = format!("w{waiting:02}");
        match ask(&admission, &name, &name, at(5)) {
            Ask::Wait(place) => {
                let expected = place.expected.expect("the rate is known").as_secs_f64();
                let want = (f64::from(place.position) + 14.0) / 0.6;
                assert!((expected - want).abs() < 1.0, "{expected} vs {want}");
                assert!(waiting < 1000, "never refused");
                waiting += 1;
            }
            Ask::Refuse(refusal) => break refusal,
            other => panic!("{other:?}"),
        }
    };
    // (22 + 14) / 0.6 = 60 s fits the allowance; (23 + 14) / 0.6 does not. Counting the 17
    // admitted Pods as running sandboxes, it said 23 / (20 / 5) = 6 s.
    assert_eq!((waiting, refusal.position), (22, 23));
    // The 3 the node took hold it from when it did: ended 3 s later, they held it 3 s, not 8.
    for i in 3..6 {
        let name = format!("r{i:02}");
        admission.ended(&run(&name), &name, at(8));
    }
    let hold = admission.queues.lock().unwrap()[NS].hold.unwrap();
    assert!(hold < 5.0, "{hold}");
}

#[test]
fn runs_that_came_before_the_queue_could_tell_its_rate_are_accepted_and_later_ones_judged() {
    let admission = Admission::new(Duration::from_secs(60));
    for i in 0..10 {
        let name = format!("r{i}");
        assert_eq!(ask(&admission, &name, &name, at(0)), Ask::Go);
        on_a_node(&admission, &run(&name), &name, at(0));
    }
    admission.no_room(&run("w000"), "w000", "w000", None, LONGEST, at(1));
    // A burst a second after the sandboxes were taken: nothing to tell a rate by yet.
    for i in 1..150 {
        let name = format!("w{i:03}");
        let Ask::Wait(place) = ask(&admission, &name, &name, at(1)) else {
            panic!("{name} not waiting")
        };
        assert_eq!(place.expected, None);
    }
    // At 6 s the 10 sandboxes have been held 6 s: 10 / 6 a second, 0.6 s a place. The burst
    // was accepted: nobody in it is refused now that the estimate says 90 s for the last.
    for s in [6, 14, 22, 30, 38, 46, 54, 62, 70] {
        for i in 0..150 {
            let name = format!("w{i:03}");
            let again = admission.ask(&run(&name), &name, &name, Some(at(1)), LONGEST, None, at(s));
            assert!(
                matches!(again, Ask::Wait(_) | Ask::Head),
                "{name} at {s}: {again:?}"
            );
        }
    }
    // A run arriving now is judged on arrival: the queue has admitted nobody for a whole
    // minute, so it cannot say when; refused at once, to retry after the allowance.
    let Ask::Refuse(refusal) = ask(&admission, "late", "z", at(70)) else {
        panic!("not refused")
    };
    assert_eq!(refusal.position, 151);
    assert!(!refusal.last_resort);
    assert_eq!(refusal.expected, None);
    assert_eq!(refusal.retry_after_seconds, 60);
}

/// `room` sandboxes ran at once from 0 s while a run waited, each held 5 s; then that run
/// held one until 10 s. The queue is empty again after.
fn saw_room(admission: &Admission, room: usize) {
    for i in 0..room {
        let name = format!("e{i}");
        assert_eq!(ask(admission, &name, &name, at(0)), Ask::Go);
        on_a_node(admission, &run(&name), &name, at(0));
    }
    admission.no_room(&run("q"), "q", "q", None, LONGEST, at(0));
    for i in 0..room {
        let name = format!("e{i}");
        admission.ended(&run(&name), &name, at(5));
    }
    on_a_node(admission, &run("q"), "q", at(5));
    admission.ended(&run("q"), "q", at(10));
}

#[test]
fn in_the_first_seconds_of_a_burst_the_room_seen_lately_stands_for_the_sandboxes_running() {
    let admission = Admission::new(Duration::from_secs(60));
    // Earlier: three sandboxes ran while a run waited (the room is 3), each held 5 s.
    saw_room(&admission, 3);
    // A burst at 100 s: the quota lets 20 cold Pods in before any is placed, the 21st is
    // refused for quota, and the rest arrive while no Pod has a node yet.
    for i in 0..20 {
        let name = format!("r{i:02}");
        assert_eq!(ask(&admission, &name, &name, at(100)), Ask::Go);
        admission.admitted(&run(&name), &name, COLD, at(100));
    }
    admission.no_room(&run("w00"), "w00", "w00", None, LONGEST, at(100));
    let mut waiting = 1;
    let refusal = loop {
        let name = format!("w{waiting:02}");
        match ask(&admission, &name, &name, at(100)) {
            Ask::Wait(_) if waiting < 1000 => waiting += 1,
            Ask::Refuse(refusal) => break refusal,
            other => panic!("{other:?}"),
        }
    };
    // 3 at a time, 5 s each: 0.6 a second, behind the 20 Pods: (16 + 20) / 0.6 = 60 s is the
    // last place that fits. Without the room seen lately nothing ran, and everyone was let in.
    assert_eq!((waiting, refusal.position), (16, 17));
    // Seen at 0 s, that room stands for ten minutes, then says nothing any more.
    let queues = admission.queues.lock().unwrap();
    assert_eq!(queues[NS].peak(at(599)), Some(3));
    assert_eq!(queues[NS].peak(at(600)), None);
}

#[test]
fn a_retry_hint_is_never_further_off_than_the_last_resort() {
    // 100 places at one a second: expected 100 s, hint 70 s. 300 places: 270 s, capped at 120.
    let admission = busy_queue(60, 299);
    let Ask::Refuse(refusal) = ask(&admission, "late", "z", at(20)) else {
        panic!("not refused")
    };
    assert!(refusal.expected.unwrap().as_secs() > 250);
    assert_eq!(refusal.retry_after_seconds, 120);
}

#[test]
fn the_room_seen_lately_does_not_stand_for_sandboxes_when_no_pod_waits_for_a_node() {
    let admission = Admission::new(Duration::from_secs(60));
    // Five ran at once while a run waited; then the room shrank to one (the quota lowered).
    saw_room(&admission, 5);
    // One sandbox held from 20 s, three calls waiting for room (no Pod of theirs: the quota).
    assert_eq!(ask(&admission, "holder", "h", at(20)), Ask::Go);
    on_a_node(&admission, &run("holder"), "holder", at(20));
    for i in 0..3 {
        let name = format!("w{i}");
        admission.no_room(&run(&name), &name, &name, None, LONGEST, at(21));
    }
    // At 41 s the one sandbox has been held 21 s: four places ahead of a new call, 84 s.
    for i in 0..3 {
        let name = format!("w{i}");
        admission.ask(
            &run(&name),
            &name,
            &name,
            Some(at(21)),
            LONGEST,
            None,
            at(41),
        );
    }
    let Ask::Refuse(refusal) = ask(&admission, "late", "z", at(41)) else {
        panic!("not refused: the room of five seen earlier stood for the one there is")
    };
    let expected = refusal.expected.unwrap().as_secs();
    assert!((80..=90).contains(&expected), "{expected}");
}

#[test]
fn before_the_queue_can_tell_its_pace_a_run_that_might_wait_too_long_is_refused_and_told_to_come_back_soon()
 {
    // A new leader meets a burst: the quota let 20 cold Pods in and a node took 3. Nothing has
    // been held long enough to tell a pace.
    let admission = Admission::new(Duration::from_secs(60));
    for i in 0..20 {
        let name = format!("r{i:02}");
        assert_eq!(ask(&admission, &name, &name, at(0)), Ask::Go);
        admission.admitted(&run(&name), &name, COLD, at(0));
    }
    for i in 0..3 {
        let name = format!("r{i:02}");
        admission.scheduling(&run(&name), &name, Placement::Placed, at(1));
    }
    // The 21st run, refused for quota, may hold its sandbox 40 s: 17 Pods and its own place
    // ahead on 3 sandboxes are 6 turns of up to 40 s, more than the 60 s it may wait. Refused at
    // once (its reconcile, like the burst's others, had been let ask while nobody waited), and
    // told to come back when the pace is known.
    let longest = Duration::from_secs(40);
    let Ask::Refuse(refusal) = admission.no_room(&run("w01"), "w01", "w01", None, longest, at(1))
    else {
        panic!("a wait of up to 240 s accepted")
    };
    assert_eq!(refusal.position, 1);
    assert_eq!(refusal.expected, None);
    assert_eq!(refusal.unknown_pace, Some(longest));
    assert!(!refusal.last_resort);
    assert_eq!(
        u64::from(refusal.retry_after_seconds),
        UNKNOWN_PACE_RETRY.as_secs()
    );
    assert!(
        refusal
            .message(Duration::from_secs(60))
            .contains("pace is not known yet"),
        "{}",
        refusal.message(Duration::from_secs(60))
    );
    // Short runs fit even at the longest: 6 turns of 2 s. The next, with 40 s, arrives behind
    // it: 7 turns, refused.
    let short = Duration::from_secs(2);
    assert!(matches!(
        admission.no_room(&run("w02"), "w02", "w02", None, short, at(1)),
        Ask::Wait(Place {
            position: 1,
            expected: None,
            ..
        })
    ));
    assert!(matches!(
        admission.ask(&run("w03"), "w03", "w03", None, longest, None, at(1)),
        Ask::Refuse(Refusal {
            position: 2,
            unknown_pace: Some(_),
            ..
        })
    ));
    // A run that waits keeps its place when it asks again: judged once, on arrival.
    assert!(matches!(
        admission.no_room(&run("w02"), "w02", "w02", Some(at(1)), longest, at(2)),
        Ask::Wait(Place { position: 1, .. })
    ));
    // At 7 s the 3 sandboxes have been held 6 s: half a run a second, (2 + 17) / 0.5 = 38 s for
    // the next place. The pace decides now, whatever the run's own limit.
    let Ask::Wait(place) = admission.ask(&run("w04"), "w04", "w04", None, longest, None, at(7))
    else {
        panic!("judged on the longest wait once the pace is known")
    };
    assert_eq!(place.position, 2);
    assert_eq!(place.expected.map(|e| e.as_secs()), Some(38));
}

#[test]
fn before_a_sandbox_is_placed_the_hold_seen_lately_bounds_the_wait_not_the_runs_whole_limit() {
    // Runs held their sandboxes 2 s each lately (the queue's cluster test's first call).
    let admission = Admission::new(Duration::from_secs(60));
    assert_eq!(ask(&admission, "x", "x", at(0)), Ask::Go);
    on_a_node(&admission, &run("x"), "x", at(0));
    admission.ended(&run("x"), "x", at(2));
    // A long run takes the one sandbox; its Pod is not placed yet when the next calls meet the
    // quota: nothing runs, so the pace cannot be told.
    assert_eq!(ask(&admission, "holder", "h", at(10)), Ask::Go);
    admission.admitted(&run("holder"), "holder", COLD, at(10));
    let longest = Duration::from_secs(100);
    // Bounded by the 2-s hold, not by 100 s: the holder's Pod and 3 places are 8 s.
    for (i, name) in ["w0", "w1", "w2"].into_iter().enumerate() {
        let asked = if i == 0 {
            admission.no_room(&run(name), name, name, None, longest, at(11))
        } else {
            admission.ask(&run(name), name, name, None, longest, None, at(11))
        };
        assert!(matches!(asked, Ask::Wait(_)), "{name}: {asked:?}");
    }
}

#[test]
fn a_run_whose_reconcile_comes_late_keeps_its_place_and_the_next_asks_meanwhile() {
    let admission = Admission::new(Duration::from_secs(60));
    admission.no_room(&run("a1"), "a1", "a", None, LONGEST, at(0));
    assert_eq!(position(&ask(&admission, "b1", "b", at(1))), 2);
    // a1's reconciles come late (an operator busy with a burst); b1's come on time. A
    // reconcile some seconds late is not lapsed.
    for s in [10, 20, 29] {
        let asked = admission.ask(&run("b1"), "b1", "b", Some(at(1)), LONGEST, None, at(s));
        assert_eq!(position(&asked), 2, "{s}");
    }
    // a1 has lapsed: b1 asks in its stead, and is let in.
    assert_eq!(
        admission.ask(&run("b1"), "b1", "b", Some(at(1)), LONGEST, None, at(31)),
        Ask::Head
    );
    on_a_node(&admission, &run("b1"), "b1", at(31));
    // A run arriving meanwhile asks too while a1 is late; the quota has no room for it, and it
    // waits behind a1, which still holds its place.
    assert_eq!(ask(&admission, "c1", "c", at(32)), Ask::Head);
    let c1 = admission.no_room(&run("c1"), "c1", "c", Some(at(32)), LONGEST, at(32));
    assert_eq!(position(&c1), 2);
    // a1's reconcile comes at last: it heads the queue, not behind the runs that came after it.
    assert_eq!(
        admission.ask(&run("a1"), "a1", "a", Some(at(0)), LONGEST, None, at(45)),
        Ask::Head
    );
    let c1 = admission.ask(&run("c1"), "c1", "c", Some(at(32)), LONGEST, None, at(45));
    assert_eq!(position(&c1), 2);
}

#[test]
fn a_gone_run_leaves_the_queue_at_its_last_resort() {
    let admission = Admission::new(Duration::from_secs(30));
    admission.no_room(&run("gone"), "gone", "a", None, LONGEST, at(0));
    let holds = || {
        admission.queues.lock().unwrap()[NS]
            .entries
            .contains_key("gone")
    };
    // b1 waits behind it and is reconciled; the deleted run never is again.
    for s in (1..60).step_by(3) {
        admission.ask(&run("b1"), "b1", "b", Some(at(1)), LONGEST, None, at(s));
    }
    assert!(
        holds(),
        "kept until a run that came back would be refused anyway"
    );
    admission.ask(&run("b1"), "b1", "b", Some(at(1)), LONGEST, None, at(60));
    assert!(!holds(), "dropped at its last resort");
}

#[test]
fn a_queue_that_fills_again_is_judged_on_the_pace_it_last_admitted_at() {
    let admission = Admission::new(Duration::from_secs(60));
    // Twenty runs wait for room; one is let in every 2 s while the others still wait.
    admission.no_room(&run("w00"), "w00", "w00", None, LONGEST, at(0));
    for i in 1..20 {
        let name = format!("w{i:02}");
        assert!(matches!(ask(&admission, &name, &name, at(0)), Ask::Wait(_)));
    }
    for k in 0..10 {
        let now = at(2 * (k + 1));
        for i in k..20 {
            let name = format!("w{i:02}");
            admission.ask(&run(&name), &name, &name, Some(at(0)), LONGEST, None, now);
        }
        let name = format!("w{k:02}");
        on_a_node(&admission, &run(&name), &name, now);
    }
    // The rest are cancelled and every sandbox given back: the queue is empty, nothing runs.
    for i in 0..20 {
        let name = format!("w{i:02}");
        admission.ended(&run(&name), &name, at(21));
    }
    // A burst at 100 s: judged at once on the pace of 0.5 a second, so 30 places fit in the
    // 60 s (without it: on the sandboxes' hold alone, no pace known).
    admission.no_room(&run("b00"), "b00", "b00", None, LONGEST, at(100));
    let mut waiting = 1;
    let refusal = loop {
        let name = format!("b{waiting:02}");
        match ask(&admission, &name, &name, at(100)) {
            Ask::Wait(place) if waiting < 100 => {
                assert!(place.expected.is_some(), "{name}: the pace is known");
                waiting += 1;
            }
            Ask::Refuse(refusal) => break refusal,
            other => panic!("{other:?}"),
        }
    };
    assert_eq!((waiting, refusal.position), (30, 31));
    assert_eq!(refusal.expected, Some(Duration::from_secs(62)));
    // Ten minutes on, that pace says nothing any more.
    let queues = admission.queues.lock().unwrap();
    assert!(queues[NS].last_pace(at(619)).is_some());
    assert!(queues[NS].last_pace(at(621)).is_none());
}

/// The room the quota had for `sandboxes` more, seen at `seen`, counting the Pods `counted`.
fn room(sandboxes: u32, seen: i64, counted: &[&str]) -> Room {
    Room {
        sandboxes,
        seen: at(seen),
        counted: Arc::new(counted.iter().map(|p| (*p).to_owned()).collect()),
        warm: 0,
    }
}

/// Run `name` asks at `now`, the quota having had room for `room` more sandboxes at `seen`,
/// counting no Pod of the operator's.
fn ask_with_room(admission: &Admission, name: &str, room: u32, seen: i64, now: i64) -> Ask {
    ask_in(admission, name, self::room(room, seen, &[]), now)
}

/// Run `name` asks at `now` with `room`.
fn ask_in(admission: &Admission, name: &str, room: Room, now: i64) -> Ask {
    admission.ask(&run(name), name, name, None, LONGEST, Some(room), at(now))
}

#[test]
fn a_burst_asks_only_for_the_room_the_quota_has_and_the_rest_are_judged_on_arrival() {
    // Runs may hold a sandbox 40 s and wait 60: with nothing running yet, a run with one
    // sandbox ahead of it may wait up to 80 s.
    let admission = Admission::new(Duration::from_secs(60));
    let longest = Duration::from_secs(40);
    let asks: Vec<Ask> = (0..6)
        .map(|i| {
            let name = format!("r{i}");
            let quota = Some(room(3, 0, &[]));
            admission.ask(&run(&name), &name, &name, None, longest, quota, at(1))
        })
        .collect();
    // Three ask; the fourth heads the queue and asks for the queue (the quota seen may lag a
    // sandbox just freed); the fifth is judged at once, not after a create the quota refuses.
    assert_eq!(asks[..3], [Ask::Go, Ask::Go, Ask::Go]);
    assert_eq!(asks[3], Ask::Head);
    assert!(
        matches!(&asks[4], Ask::Refuse(r) if r.position == 2),
        "{:?}",
        asks[4]
    );
    assert!(matches!(&asks[5], Ask::Refuse(_)), "{:?}", asks[5]);
    // A longer allowance: the rest wait in the queue, in the order they came.
    let admission = Admission::new(Duration::from_secs(600));
    for i in 0..3 {
        assert_eq!(
            ask_with_room(&admission, &format!("s{i}"), 3, 0, 1),
            Ask::Go
        );
    }
    assert_eq!(ask_with_room(&admission, "s3", 3, 0, 1), Ask::Head);
    assert_eq!(position(&ask_with_room(&admission, "s4", 3, 0, 1)), 2);
}

#[test]
fn runs_let_ask_count_against_the_room_until_it_counts_their_pod() {
    let admission = Admission::new(Duration::from_secs(60));
    assert_eq!(ask_with_room(&admission, "a", 2, 0, 1), Ask::Go);
    admission.admitted(&run("a"), "a", Sandbox::Created("a-pod"), at(2));
    // Seen at 3, after a's Pod was created, but without it: a watch under load delivers a
    // state older than the moment it is seen. a's Pod still counts.
    assert_eq!(ask_with_room(&admission, "b", 2, 3, 3), Ask::Go);
    admission.admitted(&run("b"), "b", Sandbox::Created("b-pod"), at(4));
    assert_eq!(ask_with_room(&admission, "c", 2, 5, 5), Ask::Head);
    admission.ended(&run("c"), "c", at(5));
    // A room that counts one of them: the other still takes room beside it.
    assert_eq!(ask_in(&admission, "c", room(2, 5, &["a-pod"]), 5), Ask::Go);
    admission.ended(&run("c"), "c", at(5));
    // One that counts both Pods: the room it says is all there is.
    let both = || room(1, 6, &["a-pod", "b-pod"]);
    assert_eq!(ask_in(&admission, "d", both(), 7), Ask::Go);
    assert_eq!(ask_in(&admission, "e", both(), 7), Ask::Head);
    admission.ended(&run("e"), "e", at(7));
    // The quota refused d after all (its view lagged): d takes no room of the quota seen next.
    admission.no_room(&run("d"), "d", "d", None, LONGEST, at(8));
    admission.ended(&run("d"), "d", at(8));
    assert_eq!(ask_in(&admission, "f", room(1, 9, &[]), 9), Ask::Go);
    // A run that was let ask and then heard of no more (its reconcile failed) stops counting.
    assert_eq!(ask_with_room(&admission, "g", 1, 9, 9), Ask::Head);
    admission.ended(&run("g"), "g", at(9));
    let later = 9 + LAPSED_AFTER.as_secs();
    assert_eq!(ask_with_room(&admission, "h", 1, 9, later), Ask::Go);
}

#[test]
fn a_warm_claim_counts_for_its_replacement_and_an_unknown_room_for_nothing() {
    let admission = Admission::new(Duration::from_secs(60));
    // Room for one more Pod in the quota and one warm sandbox: a claims the sandbox.
    assert_eq!(ask_with_room(&admission, "a", 2, 0, 1), Ask::Go);
    admission.admitted(&run("a"), "a", Sandbox::Claimed, at(2));
    // Its Pod was counted long ago, but the pool's replacement of it takes the quota's room.
    assert_eq!(ask_with_room(&admission, "b", 1, 0, 3), Ask::Head);
    admission.ended(&run("b"), "b", at(3));
    // The pool creates it: the Pod counts instead of the claim, not beside it.
    let replacement = admission.pool_pod_creating(NS, at(4));
    admission.pool_pod_created(NS, replacement, Some("default-x1"), at(4));
    assert_eq!(ask_with_room(&admission, "c", 2, 0, 5), Ask::Go);
    assert_eq!(ask_with_room(&admission, "d", 2, 0, 5), Ask::Head);
    admission.ended(&run("d"), "d", at(5));
    // No room known (no watch, no quota): every run of an empty queue asks.
    let admission = Admission::new(Duration::from_secs(60));
    assert_eq!(ask(&admission, "e", "e", at(3)), Ask::Go);
    assert_eq!(ask(&admission, "f", "f", at(3)), Ask::Go);
}

#[test]
fn a_run_that_may_claim_a_warm_sandbox_counts_for_its_replacement_from_its_ask() {
    // Room for one more Pod in the quota and one warm sandbox.
    let with_warm = || Room {
        warm: 1,
        ..room(2, 0, &[])
    };
    let admission = Admission::new(Duration::from_secs(60));
    // a may claim the sandbox: it counts for it and for the replacement its claim starts, so
    // b, asking while a's claim is on its way, finds no room left.
    assert_eq!(ask_in(&admission, "a", with_warm(), 1), Ask::Go);
    assert_eq!(ask_in(&admission, "b", with_warm(), 1), Ask::Head);
    admission.ended(&run("b"), "b", at(1));
    // a claimed it: the warm sandbox is gone from the room, its replacement still counts.
    admission.admitted(&run("a"), "a", Sandbox::Claimed, at(2));
    assert_eq!(ask_in(&admission, "c", room(1, 2, &[]), 3), Ask::Head);
    admission.ended(&run("c"), "c", at(3));
    // a ends before its pool starts the replacement: it still counts.
    admission.ended(&run("a"), "a", at(4));
    assert_eq!(ask_in(&admission, "d", room(1, 4, &[]), 5), Ask::Head);
    admission.ended(&run("d"), "d", at(5));

    // A run that went cold instead counts for its own Pod only.
    let admission = Admission::new(Duration::from_secs(60));
    assert_eq!(ask_in(&admission, "a", with_warm(), 1), Ask::Go);
    admission.admitted(&run("a"), "a", Sandbox::Created("a-pod"), at(2));
    assert_eq!(ask_in(&admission, "b", with_warm(), 3), Ask::Go);
    // And one that left without a sandbox (refused by the quota) for nothing.
    let admission = Admission::new(Duration::from_secs(60));
    assert_eq!(ask_in(&admission, "a", with_warm(), 1), Ask::Go);
    admission.no_room(&run("a"), "a", "a", None, LONGEST, at(2));
    admission.ended(&run("a"), "a", at(2));
    let seen_since = || Room {
        warm: 1,
        ..room(2, 3, &[])
    };
    assert_eq!(ask_in(&admission, "b", seen_since(), 3), Ask::Go);
    assert_eq!(ask_in(&admission, "c", seen_since(), 3), Ask::Head);

    // Room for four more Pods and one warm sandbox: one run claims it (two places), three go
    // cold. No more runs count for a claim than there are warm sandboxes.
    let admission = Admission::new(Duration::from_secs(60));
    let wide = || Room {
        warm: 1,
        ..room(5, 0, &[])
    };
    for name in ["a", "b", "c"] {
        assert_eq!(ask_in(&admission, name, wide(), 1), Ask::Go, "{name}");
    }
    assert_eq!(ask_in(&admission, "d", wide(), 1), Ask::Go);
    assert_eq!(ask_in(&admission, "e", wide(), 1), Ask::Head);
}

#[test]
fn a_warm_runs_hold_says_nothing_of_how_soon_the_queue_moves() {
    // The runs of a burst the quota refused, with no pace known yet, after one run held a
    // sandbox for a second and ended: each sandbox ahead may be held for that second only if
    // it was a cold one (a warm one started before it was claimed).
    let judged = |placed_at_once: bool| -> Vec<bool> {
        let admission = Admission::new(Duration::from_secs(60));
        let longest = Duration::from_secs(40);
        if placed_at_once {
            admission.admitted(&run("w"), "w", Sandbox::Claimed, at(0));
        } else {
            on_a_node(&admission, &run("w"), "w", at(0));
        }
        admission.ended(&run("w"), "w", at(1));
        (0..10)
            .map(|i| {
                let name = format!("r{i}");
                let ask = admission.no_room(&run(&name), &name, &name, None, longest, at(2));
                !matches!(ask, Ask::Refuse(_))
            })
            .collect()
    };
    // After a warm run: bounded by the runs' own 40 s, one place fits in the 60 s allowance.
    let after_warm = judged(true);
    assert_eq!(
        after_warm.iter().filter(|a| **a).count(),
        1,
        "{after_warm:?}"
    );
    // After a cold run held a second: every place does.
    assert!(judged(false).iter().all(|a| *a));
}

#[test]
fn a_refusal_of_the_quotas_is_fresher_than_the_usage_seen_before_it() {
    let admission = Admission::new(Duration::from_secs(60));
    // The usage seen at 0 says room for 5, but the quota refused a Pod at 2 (the pool's
    // replacements took the room meanwhile, say).
    admission.no_room(&run("x"), "x", "x", None, LONGEST, at(2));
    admission.ended(&run("x"), "x", at(2));
    assert_eq!(ask_with_room(&admission, "a", 5, 0, 3), Ask::Head);
    admission.ended(&run("a"), "a", at(3));
    // Seen again after the refusal: its room stands.
    assert_eq!(ask_with_room(&admission, "b", 5, 4, 5), Ask::Go);
}

#[test]
fn a_pod_created_for_the_queues_head_counts_against_the_room_too() {
    let admission = Admission::new(Duration::from_secs(60));
    // A run woken from the queue asked with no room known, and got its Pod at 2.
    admission.no_room(&run("h"), "h", "h", None, LONGEST, at(0));
    assert_eq!(
        admission.ask(&run("h"), "h", "h", Some(at(0)), LONGEST, None, at(1)),
        Ask::Head
    );
    admission.admitted(&run("h"), "h", Sandbox::Created("h-pod"), at(2));
    // The quota seen at 1.5 had room for one, without h's Pod: h's Pod took it.
    let quota = Some(room(1, 1, &[]));
    assert_eq!(
        admission.ask(&run("a"), "a", "a", None, LONGEST, quota, at(3)),
        Ask::Head
    );
}

#[test]
fn a_pools_pod_counts_against_the_room_while_created_and_until_it_is_counted() {
    let admission = Admission::new(Duration::from_secs(60));
    // The quota seen at 0 had room for two; a pool is creating a replacement at 1.
    let creating = admission.pool_pod_creating(NS, at(1));
    assert_eq!(ask_with_room(&admission, "a", 2, 0, 1), Ask::Go);
    assert_eq!(ask_with_room(&admission, "b", 2, 0, 1), Ask::Head);
    admission.ended(&run("b"), "b", at(1));
    // Created at 2: it counts against a room that does not name it, however late seen, and
    // not against one that does.
    admission.pool_pod_created(NS, creating, Some("default-x1"), at(2));
    admission.admitted(&run("a"), "a", Sandbox::Created("a-pod"), at(2));
    assert_eq!(ask_with_room(&admission, "c", 2, 4, 4), Ask::Head);
    admission.ended(&run("c"), "c", at(4));
    let counted = || room(1, 4, &["default-x1", "a-pod"]);
    assert_eq!(ask_in(&admission, "d", counted(), 5), Ask::Go);
    admission.admitted(&run("d"), "d", Sandbox::Created("d-pod"), at(5));
    // A pool's create the API server refused takes no room.
    let refused = admission.pool_pod_creating(NS, at(6));
    admission.pool_pod_created(NS, refused, None, at(6));
    assert_eq!(
        ask_in(
            &admission,
            "e",
            room(1, 6, &["default-x1", "a-pod", "d-pod"]),
            7
        ),
        Ask::Go
    );
}

#[test]
fn a_pools_pod_gone_before_any_room_counted_it_stops_counting() {
    // A pool creates three Pods and is scaled to zero before any run asks: no room ever names
    // them, and they are gone.
    let admission = Admission::new(Duration::from_secs(60));
    for i in 0..3 {
        let pod = admission.pool_pod_creating(NS, at(0));
        admission.pool_pod_created(NS, pod, Some(&format!("default-x{i}")), at(0));
    }
    // Soon after, they may just not be in the watch yet: they count.
    assert_eq!(ask_with_room(&admission, "a", 1, 5, 5), Ask::Head);
    admission.ended(&run("a"), "a", at(5));
    // Once a watch would have seen them, the room is the room.
    let later = 1 + LAPSED_AFTER.as_secs();
    assert_eq!(ask_with_room(&admission, "b", 1, later, later), Ask::Go);
}

#[test]
fn the_pools_pods_and_warm_claims_are_forgotten_where_no_quota_is_seen() {
    // No ResourceQuota in the namespace: nothing ever asks with a room, which is where the
    // entries of runs are pruned; those of the pools' Pods and warm claims go on their own.
    let admission = Admission::new(Duration::from_secs(60));
    for i in 0..3 {
        admission.admitted(
            &run(&format!("w{i}")),
            &format!("w{i}"),
            Sandbox::Claimed,
            at(i),
        );
    }
    // One replacement started: it counts instead of the earliest claim.
    let pod = admission.pool_pod_creating(NS, at(3));
    admission.pool_pod_created(NS, pod, Some("default-x1"), at(3));
    let counted = |admission: &Admission| admission.queues.lock().unwrap()[NS].asked.len();
    assert_eq!(counted(&admission), 3);
    let later = at(4 + LAPSED_AFTER.as_secs());
    let pod = admission.pool_pod_creating(NS, later);
    admission.pool_pod_created(NS, pod, Some("default-x2"), later);
    assert_eq!(counted(&admission), 1);
}
