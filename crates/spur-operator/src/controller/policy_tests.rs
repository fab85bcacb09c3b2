//! The channel policy fed events by hand: no network, no clock but the instants given.

use std::time::Duration;

use tokio::time::Instant;

use super::*;

const SECOND: Duration = Duration::from_secs(1);

fn rules() -> Rules {
    Rules {
        probe: Some(SECOND),
        hedge: Some(SECOND / 4),
        patience: Some(SECOND),
        max_age: Some(10 * SECOND),
        read_your_writes: Some(2 * SECOND),
        dials: 4,
        drop_on_failure: true,
        avoid: true,
        abandon: true,
    }
}

/// A policy and a clock of its own, moved by hand.
struct Bench {
    policy: Policy,
    start: Instant,
    now: Instant,
}

impl Bench {
    fn new(rules: Rules) -> Bench {
        let start = Instant::now();
        Bench {
            policy: Policy::new(rules),
            start,
            now: start,
        }
    }

    fn at(&mut self, millis: u64) -> &mut Self {
        self.now = self.start + Duration::from_millis(millis);
        self
    }

    fn on(&mut self, event: Event) -> Vec<Command> {
        self.policy.on(self.now, event)
    }

    /// Ticks when the policy asked to be woken (asserting it asked for `millis`).
    fn tick_at(&mut self, millis: u64) -> Vec<Command> {
        let due = self.start + Duration::from_millis(millis);
        assert_eq!(self.policy.next_wake(), Some(due), "the policy's wake");
        self.now = due;
        self.on(Event::Tick)
    }

    /// A shared channel from dial 0, its probe answered, and call `call` on it.
    fn open(&mut self, call: CallId) {
        assert_eq!(
            self.on(Event::CallStarted { call }),
            [Command::Dial { dial: 0 }]
        );
        assert_eq!(
            self.on(Event::Dialed { dial: 0, ok: true }),
            [Command::Probe {
                dial: 0,
                named: false
            }]
        );
        assert_eq!(
            self.on(Event::Probed {
                dial: 0,
                answered: true
            }),
            [Command::Share { dial: 0 }, Command::Use { call, dial: 0 }]
        );
    }

    fn probed(&mut self, dial: DialId, answered: bool) -> Vec<Command> {
        self.on(Event::Probed { dial, answered })
    }

    fn ended(&mut self, call: CallId, ended: Ended) -> Vec<Command> {
        self.on(Event::CallEnded { call, ended })
    }

    fn fired(&mut self) -> Vec<Rule> {
        self.policy.take_fired()
    }
}

use Command::*;

#[test]
fn the_first_call_dials_and_later_calls_share_the_channel_its_probe_accepted() {
    let mut b = Bench::new(rules());
    b.open(1);
    assert_eq!(
        b.on(Event::CallStarted { call: 2 }),
        [Use { call: 2, dial: 0 }]
    );
    assert_eq!(b.policy.shared(), Some(0));
    assert_eq!(b.fired(), []);
}

#[test]
fn calls_waiting_for_a_dial_all_go_on_its_channel() {
    let mut b = Bench::new(rules());
    assert_eq!(b.on(Event::CallStarted { call: 1 }), [Dial { dial: 0 }]);
    assert_eq!(b.on(Event::CallStarted { call: 2 }), []);
    b.on(Event::Dialed { dial: 0, ok: true });
    assert_eq!(
        b.probed(0, true),
        [
            Share { dial: 0 },
            Use { call: 1, dial: 0 },
            Use { call: 2, dial: 0 }
        ]
    );
}

#[test]
fn a_failed_call_drops_its_channel_and_the_next_call_dials_afresh() {
    let mut b = Bench::new(rules());
    b.open(1);
    assert_eq!(
        b.ended(1, Ended::Failed),
        [
            Name { dial: 0 },
            Drop {
                dial: 0,
                rule: Rule::DropOnFailure
            }
        ]
    );
    assert_eq!(b.fired(), [Rule::DropOnFailure]);
    assert_eq!(b.on(Event::CallStarted { call: 2 }), [Dial { dial: 1 }]);
}

#[test]
fn the_round_after_a_failed_call_passes_over_the_replica_that_failed_it() {
    let mut b = Bench::new(Rules {
        hedge: None,
        ..rules()
    });
    b.open(1);
    // A follower cut off from its peers refuses the write; its channel is named as it goes.
    b.ended(1, Ended::Failed);
    b.on(Event::Named {
        dial: 0,
        replica: 7,
    });
    assert_eq!(
        b.at(300).on(Event::CallStarted { call: 2 }),
        [Dial { dial: 1 }]
    );
    // The Service hands out the same replica: named, and passed over though it answers.
    assert_eq!(
        b.on(Event::Dialed { dial: 1, ok: true }),
        [Probe {
            dial: 1,
            named: true
        }]
    );
    b.on(Event::Named {
        dial: 1,
        replica: 7,
    });
    assert_eq!(b.probed(1, true), [Discard { dial: 1 }, Dial { dial: 2 }]);
    assert_eq!(
        b.fired(),
        [Rule::DropOnFailure, Rule::Avoid, Rule::ProbeRedial]
    );
    b.on(Event::Dialed { dial: 2, ok: true });
    b.on(Event::Named {
        dial: 2,
        replica: 8,
    });
    assert_eq!(
        b.probed(2, true),
        [Share { dial: 2 }, Use { call: 2, dial: 2 }]
    );
    // Only that one round: the next failure's round passes over the next replica alone.
    b.ended(2, Ended::Failed);
    b.on(Event::CallStarted { call: 3 });
    b.on(Event::Dialed { dial: 3, ok: true });
    b.on(Event::Named {
        dial: 3,
        replica: 7,
    });
    assert_eq!(
        b.probed(3, true),
        [Share { dial: 3 }, Use { call: 3, dial: 3 }]
    );
}

/// Call 1 fails on dial 0's channel, which its Ping names replica 7, and call 2 starts the
/// round after it, with no hedge: dial 1.
fn failed_on_replica_7() -> Bench {
    let mut b = Bench::new(Rules {
        hedge: None,
        ..rules()
    });
    b.open(1);
    b.ended(1, Ended::Failed);
    b.on(Event::Named {
        dial: 0,
        replica: 7,
    });
    assert_eq!(b.on(Event::CallStarted { call: 2 }), [Dial { dial: 1 }]);
    b.fired();
    b
}

impl Bench {
    /// Dial `dial` connects, its Ping names `replica`, and its probe is `answered`.
    fn candidate(&mut self, dial: DialId, replica: ReplicaId, answered: bool) -> Vec<Command> {
        assert_eq!(
            self.on(Event::Dialed { dial, ok: true }),
            [Probe { dial, named: true }]
        );
        self.on(Event::Named { dial, replica });
        self.probed(dial, answered)
    }
}

#[test]
fn with_one_replica_the_round_after_a_failed_call_falls_back_to_it() {
    let mut b = failed_on_replica_7();
    // Every dial of the round reaches the only replica, and each is passed over.
    for dial in 1..4 {
        assert_eq!(
            b.candidate(dial, 7, true),
            [Discard { dial }, Dial { dial: dial + 1 }]
        );
    }
    // No other replica was to be had: one more dial, passing over nothing, instead of
    // failing call 2.
    assert_eq!(
        b.candidate(4, 7, true),
        [Discard { dial: 4 }, Dial { dial: 5 }]
    );
    assert_eq!(
        b.on(Event::Dialed { dial: 5, ok: true }),
        [Probe {
            dial: 5,
            named: false
        }]
    );
    assert_eq!(
        b.probed(5, true),
        [Share { dial: 5 }, Use { call: 2, dial: 5 }]
    );
    assert_eq!(
        b.fired(),
        [
            Rule::Avoid,
            Rule::ProbeRedial,
            Rule::Avoid,
            Rule::ProbeRedial,
            Rule::Avoid,
            Rule::ProbeRedial,
            Rule::Avoid
        ]
    );
}

#[test]
fn the_fallback_is_one_dial_and_when_its_probe_fails_the_calls_do() {
    let mut b = failed_on_replica_7();
    for dial in 1..4 {
        b.candidate(dial, 7, true);
    }
    b.candidate(4, 7, true);
    b.on(Event::Dialed { dial: 5, ok: true });
    assert_eq!(b.probed(5, false), [Discard { dial: 5 }, Fail { call: 2 }]);
    assert_eq!(b.policy.next_wake(), None);
}

#[test]
fn with_two_replicas_the_round_after_a_failed_call_takes_the_other_and_never_falls_back() {
    // The other replica answers: it is shared (the pass-over as it was).
    let mut b = failed_on_replica_7();
    assert_eq!(
        b.candidate(1, 7, true),
        [Discard { dial: 1 }, Dial { dial: 2 }]
    );
    assert_eq!(
        b.candidate(2, 8, true),
        [Share { dial: 2 }, Use { call: 2, dial: 2 }]
    );

    // The other replica is met but its probe fails: the round fails its call as before,
    // with no fallback to the replica passed over.
    let mut b = failed_on_replica_7();
    assert_eq!(
        b.candidate(1, 8, false),
        [Discard { dial: 1 }, Dial { dial: 2 }]
    );
    for dial in 2..4 {
        b.candidate(dial, 7, true);
    }
    assert_eq!(
        b.candidate(4, 7, true),
        [Discard { dial: 4 }, Fail { call: 2 }]
    );

    // So does a round one of whose connects failed: another replica may be behind it.
    let mut b = failed_on_replica_7();
    assert_eq!(
        b.on(Event::Dialed { dial: 1, ok: false }),
        [Dial { dial: 2 }]
    );
    for dial in 2..4 {
        b.candidate(dial, 7, true);
    }
    assert_eq!(
        b.candidate(4, 7, true),
        [Discard { dial: 4 }, Fail { call: 2 }]
    );
}

#[test]
fn a_round_after_a_read_behind_never_falls_back() {
    let mut b = Bench::new(Rules {
        hedge: None,
        ..rules()
    });
    b.open(1);
    b.ended(1, Ended::Behind);
    b.on(Event::Named {
        dial: 0,
        replica: 7,
    });
    b.on(Event::CallStarted { call: 2 });
    for dial in 1..4 {
        b.candidate(dial, 7, true);
    }
    // Rule 6's round that finds no other replica ends, as its doc says.
    assert_eq!(
        b.candidate(4, 7, true),
        [Discard { dial: 4 }, Fail { call: 2 }]
    );
}

#[test]
fn with_avoid_off_a_failed_call_names_nothing_and_the_next_round_takes_any_replica() {
    let mut b = Bench::new(Rules {
        avoid: false,
        ..rules()
    });
    b.open(1);
    assert_eq!(
        b.ended(1, Ended::Failed),
        [Drop {
            dial: 0,
            rule: Rule::DropOnFailure
        }]
    );
    b.on(Event::CallStarted { call: 2 });
    assert_eq!(
        b.on(Event::Dialed { dial: 1, ok: true }),
        [Probe {
            dial: 1,
            named: false
        }]
    );
}

#[test]
fn an_answer_or_a_caller_leaving_keeps_the_channel() {
    let mut b = Bench::new(rules());
    b.open(1);
    assert_eq!(b.ended(1, Ended::Answered), []);
    b.on(Event::CallStarted { call: 2 });
    assert_eq!(b.ended(2, Ended::Left), []);
    assert_eq!(b.policy.shared(), Some(0));
}

#[test]
fn a_failure_on_a_channel_already_replaced_drops_nothing() {
    let mut b = Bench::new(rules());
    b.open(1);
    // Call 1 waits past the patience; a replacement is shared at 1.1 s...
    assert_eq!(b.tick_at(1000), [Name { dial: 0 }, Dial { dial: 1 }]);
    b.at(1100).on(Event::Dialed { dial: 1, ok: true });
    b.on(Event::CallStarted { call: 2 });
    let shared = b.probed(1, true);
    assert!(shared.contains(&Share { dial: 1 }), "{shared:?}");
    // ...call 2, started on the old one just before, may still fail there.
    assert_eq!(b.ended(2, Ended::Failed), []);
    assert_eq!(b.policy.shared(), Some(1));
}

#[test]
fn a_channel_whose_probe_fails_is_dialed_again_and_when_all_fail_the_calls_do() {
    let mut b = Bench::new(Rules {
        hedge: None,
        ..rules()
    });
    b.on(Event::CallStarted { call: 1 });
    for dial in 0..3 {
        b.on(Event::Dialed { dial, ok: true });
        assert_eq!(
            b.probed(dial, false),
            [Discard { dial }, Dial { dial: dial + 1 }]
        );
    }
    b.on(Event::Dialed { dial: 3, ok: true });
    assert_eq!(b.probed(3, false), [Discard { dial: 3 }, Fail { call: 1 }]);
    assert_eq!(b.fired(), [Rule::ProbeRedial; 3]);
    assert_eq!(b.policy.shared(), None);
}

#[test]
fn when_every_connect_fails_the_waiting_calls_fail() {
    let mut b = Bench::new(Rules {
        hedge: None,
        dials: 2,
        ..rules()
    });
    b.on(Event::CallStarted { call: 1 });
    b.on(Event::CallStarted { call: 2 });
    assert_eq!(
        b.on(Event::Dialed { dial: 0, ok: false }),
        [Dial { dial: 1 }]
    );
    assert_eq!(
        b.on(Event::Dialed { dial: 1, ok: false }),
        [Fail { call: 1 }, Fail { call: 2 }]
    );
    assert_eq!(b.policy.shared(), None);
    // Nothing is left running: the next call starts a new round.
    assert_eq!(b.policy.next_wake(), None);
    assert_eq!(b.on(Event::CallStarted { call: 3 }), [Dial { dial: 2 }]);
}

#[test]
fn while_no_dial_has_a_verdict_another_starts_every_quarter_bound_four_at_most() {
    let mut b = Bench::new(rules());
    b.on(Event::CallStarted { call: 1 });
    assert_eq!(b.tick_at(250), [Dial { dial: 1 }]);
    assert_eq!(b.tick_at(500), [Dial { dial: 2 }]);
    assert_eq!(b.tick_at(750), [Dial { dial: 3 }]);
    assert_eq!(b.policy.next_wake(), None, "four dials, no more");
    assert_eq!(b.fired(), [Rule::Hedge, Rule::Hedge, Rule::Hedge]);
    // The third dial answers first: shared; the others are discarded as they report.
    b.at(800).on(Event::Dialed { dial: 2, ok: true });
    assert_eq!(
        b.probed(2, true),
        [Share { dial: 2 }, Use { call: 1, dial: 2 }]
    );
    assert_eq!(
        b.on(Event::Dialed { dial: 0, ok: true }),
        [Discard { dial: 0 }]
    );
    assert_eq!(b.probed(0, true), [Discard { dial: 0 }]);
}

#[test]
fn without_a_probe_a_dialed_channel_is_shared_at_once() {
    let mut b = Bench::new(Rules {
        probe: None,
        hedge: None,
        patience: None,
        ..rules()
    });
    b.on(Event::CallStarted { call: 1 });
    assert_eq!(
        b.on(Event::Dialed { dial: 0, ok: true }),
        [Share { dial: 0 }, Use { call: 1, dial: 0 }]
    );
    assert_eq!(b.policy.next_wake(), None);
}

#[test]
fn a_call_past_its_patience_is_abandoned_once_a_new_channel_serves() {
    let mut b = Bench::new(rules());
    b.open(1);
    b.at(400).on(Event::CallStarted { call: 2 });
    // Call 1's patience runs out at 1 s: a replacement round.
    assert_eq!(b.tick_at(1000), [Name { dial: 0 }, Dial { dial: 1 }]);
    assert_eq!(b.fired(), [Rule::Patience]);
    b.at(1010).on(Event::Dialed { dial: 1, ok: true });
    assert_eq!(
        b.probed(1, true),
        [
            Share { dial: 1 },
            Drop {
                dial: 0,
                rule: Rule::Patience
            },
            Abandon { call: 1 }
        ]
    );
    // Call 2 (0.61 s old) may finish on the old channel until its own patience.
    assert_eq!(b.tick_at(1400), [Abandon { call: 2 }]);
    assert_eq!(b.fired(), [Rule::Abandon, Rule::Abandon]);
    assert_eq!(b.policy.next_wake(), None);
}

#[test]
fn a_slow_call_keeps_its_channel_while_no_other_serves_and_rounds_come_once_a_bound() {
    let mut b = Bench::new(rules());
    b.open(1);
    assert_eq!(b.tick_at(1000), [Name { dial: 0 }, Dial { dial: 1 }]);
    // Every replacement dial finds a replica that does not serve.
    for (at, dial) in [(1250, 2), (1500, 3), (1750, 4)] {
        assert_eq!(b.tick_at(at), [Dial { dial }]);
    }
    for dial in 1..=4 {
        b.at(1900).on(Event::Dialed { dial, ok: true });
        b.probed(dial, false);
    }
    assert_eq!(b.policy.shared(), Some(0), "nothing better: kept");
    // The next round one bound after the last started, not at once.
    assert_eq!(b.tick_at(2000), [Name { dial: 0 }, Dial { dial: 5 }]);
}

#[test]
fn a_failure_during_a_replacement_makes_the_calls_wait_for_it() {
    let mut b = Bench::new(rules());
    b.open(1);
    b.tick_at(1000);
    b.at(1100).on(Event::CallStarted { call: 2 });
    // The patience round asked for the channel's name already.
    assert_eq!(
        b.ended(2, Ended::Failed),
        [Drop {
            dial: 0,
            rule: Rule::DropOnFailure
        }]
    );
    // Call 3 waits for the replacement round's dial instead of starting another.
    assert_eq!(b.on(Event::CallStarted { call: 3 }), []);
    b.on(Event::Dialed { dial: 1, ok: true });
    assert_eq!(
        b.probed(1, true),
        [
            Share { dial: 1 },
            Use { call: 3, dial: 1 },
            Abandon { call: 1 }
        ]
    );
}

#[test]
fn a_channel_past_its_maximum_age_is_replaced_by_one_to_another_replica_whose_probe_is_answered() {
    let mut b = Bench::new(rules());
    b.open(1);
    b.ended(1, Ended::Answered);
    // At 10 s the next call still goes on the old channel, which is named, and a round
    // starts.
    assert_eq!(
        b.at(10_000).on(Event::CallStarted { call: 2 }),
        [Name { dial: 0 }, Dial { dial: 1 }, Use { call: 2, dial: 0 }]
    );
    assert_eq!(b.fired(), [Rule::Rotate]);
    b.on(Event::Named {
        dial: 0,
        replica: 7,
    });
    assert_eq!(
        b.on(Event::Dialed { dial: 1, ok: true }),
        [Probe {
            dial: 1,
            named: true
        }]
    );
    // A replacement whose probe fails is not taken.
    assert_eq!(b.probed(1, false), [Discard { dial: 1 }, Dial { dial: 2 }]);
    // Nor one to the replica the channel already reaches, though its probe is answered (a
    // leader cut off from its peers serves the probe's read from its own state).
    b.on(Event::Dialed { dial: 2, ok: true });
    b.on(Event::Named {
        dial: 2,
        replica: 7,
    });
    assert_eq!(b.probed(2, true), [Discard { dial: 2 }, Dial { dial: 3 }]);
    b.on(Event::Dialed { dial: 3, ok: true });
    b.on(Event::Named {
        dial: 3,
        replica: 8,
    });
    assert_eq!(
        b.probed(3, true),
        [
            Share { dial: 3 },
            Drop {
                dial: 0,
                rule: Rule::Rotate
            }
        ]
    );
    assert_eq!(
        b.fired(),
        [Rule::ProbeRedial, Rule::Avoid, Rule::ProbeRedial]
    );
}

#[test]
fn a_rotation_that_finds_no_other_replica_keeps_the_channel_for_another_maximum_age() {
    let mut b = Bench::new(Rules {
        hedge: None,
        dials: 2,
        ..rules()
    });
    b.open(1);
    b.ended(1, Ended::Answered);
    b.at(10_000).on(Event::CallStarted { call: 2 });
    b.on(Event::Named {
        dial: 0,
        replica: 7,
    });
    for dial in 1..=2 {
        b.on(Event::Dialed { dial, ok: true });
        b.on(Event::Named { dial, replica: 7 });
        assert_eq!(b.probed(dial, true)[0], Discard { dial });
    }
    assert_eq!(b.policy.shared(), Some(0));
    // Kept, and aged afresh: no new round until another 10 s have passed.
    assert_eq!(
        b.at(19_000).on(Event::CallStarted { call: 3 }),
        [Use { call: 3, dial: 0 }]
    );
    assert_eq!(
        b.at(20_000).on(Event::CallStarted { call: 4 }),
        [Dial { dial: 3 }, Use { call: 4, dial: 0 }]
    );
}

#[test]
fn with_avoid_off_a_rotation_takes_any_replica_whose_probe_is_answered() {
    let mut b = Bench::new(Rules {
        avoid: false,
        ..rules()
    });
    b.open(1);
    b.ended(1, Ended::Answered);
    assert_eq!(
        b.at(10_000).on(Event::CallStarted { call: 2 }),
        [Dial { dial: 1 }, Use { call: 2, dial: 0 }]
    );
    assert_eq!(
        b.on(Event::Dialed { dial: 1, ok: true }),
        [Probe {
            dial: 1,
            named: false
        }]
    );
    assert_eq!(
        b.probed(1, true),
        [
            Share { dial: 1 },
            Drop {
                dial: 0,
                rule: Rule::Rotate
            }
        ]
    );
}

#[test]
fn without_patience_a_slow_call_is_left_to_its_request_bound() {
    let mut b = Bench::new(Rules {
        patience: None,
        ..rules()
    });
    b.open(1);
    assert_eq!(b.policy.next_wake(), None);
    assert_eq!(b.at(4000).on(Event::Tick), []);
}

#[test]
fn a_patience_round_passes_over_a_channel_to_the_replica_the_calls_are_stuck_on() {
    let mut b = Bench::new(Rules {
        hedge: None,
        ..rules()
    });
    b.open(1);
    assert_eq!(b.tick_at(1000), [Name { dial: 0 }, Dial { dial: 1 }]);
    b.on(Event::Named {
        dial: 0,
        replica: 7,
    });
    // The Service picks the same replica (a leader cut off from its peers: it serves
    // reads from its own state) and the candidate is named before its probe.
    assert_eq!(
        b.on(Event::Dialed { dial: 1, ok: true }),
        [Probe {
            dial: 1,
            named: true
        }]
    );
    b.on(Event::Named {
        dial: 1,
        replica: 7,
    });
    assert_eq!(b.probed(1, true), [Discard { dial: 1 }, Dial { dial: 2 }]);
    assert_eq!(b.fired(), [Rule::Patience, Rule::Avoid, Rule::ProbeRedial]);
    b.on(Event::Dialed { dial: 2, ok: true });
    b.on(Event::Named {
        dial: 2,
        replica: 8,
    });
    assert_eq!(
        b.probed(2, true),
        [
            Share { dial: 2 },
            Drop {
                dial: 0,
                rule: Rule::Patience
            },
            Abandon { call: 1 }
        ]
    );
}

#[test]
fn a_read_behind_an_acknowledged_write_leaves_its_replica_for_another() {
    let mut b = Bench::new(Rules {
        hedge: None,
        ..rules()
    });
    b.open(1);
    // The channel was never named: it is Pinged as it goes, and a round starts at once.
    assert_eq!(
        b.at(300).ended(1, Ended::Behind),
        [
            Name { dial: 0 },
            Drop {
                dial: 0,
                rule: Rule::ReadYourWrites
            },
            Dial { dial: 1 }
        ]
    );
    assert_eq!(b.fired(), [Rule::ReadYourWrites]);
    assert_eq!(b.policy.shared(), None);
    // The Ping of the dropped channel answers; the next call waits for the round.
    b.on(Event::Named {
        dial: 0,
        replica: 7,
    });
    assert_eq!(b.on(Event::CallStarted { call: 2 }), []);
    // The Service picks the same replica: passed over, though its probe is answered.
    assert_eq!(
        b.on(Event::Dialed { dial: 1, ok: true }),
        [Probe {
            dial: 1,
            named: true
        }]
    );
    b.on(Event::Named {
        dial: 1,
        replica: 7,
    });
    assert_eq!(b.probed(1, true), [Discard { dial: 1 }, Dial { dial: 2 }]);
    assert_eq!(b.fired(), [Rule::Avoid, Rule::ProbeRedial]);
    b.on(Event::Dialed { dial: 2, ok: true });
    b.on(Event::Named {
        dial: 2,
        replica: 8,
    });
    assert_eq!(
        b.probed(2, true),
        [Share { dial: 2 }, Use { call: 2, dial: 2 }]
    );
}

#[test]
fn a_read_behind_on_a_channel_already_replaced_or_with_the_rule_off_changes_nothing() {
    let mut off = Bench::new(Rules {
        read_your_writes: None,
        ..rules()
    });
    off.open(1);
    assert_eq!(off.ended(1, Ended::Behind), []);
    assert_eq!(off.policy.shared(), Some(0));

    let mut b = Bench::new(rules());
    b.open(1);
    b.on(Event::CallStarted { call: 2 });
    b.ended(2, Ended::Failed);
    b.on(Event::CallStarted { call: 3 });
    b.on(Event::Dialed { dial: 1, ok: true });
    b.probed(1, true);
    assert_eq!(b.fired(), [Rule::DropOnFailure]);
    // Call 1 answered late on the dropped channel 0.
    assert_eq!(b.ended(1, Ended::Behind), []);
    assert_eq!(b.policy.shared(), Some(1));
}

#[test]
fn every_rule_can_be_switched_off_on_its_own() {
    let default = crate::controller::ChannelConfig::default();
    let shipped = Rules::from_config(&default);
    for rule in Rule::ALL {
        let config = crate::controller::ChannelConfig {
            rules_off: [rule].into(),
            ..default.clone()
        };
        assert_ne!(Rules::from_config(&config), shipped, "{rule:?}");
        assert_eq!(rule.name().parse::<Rule>(), Ok(rule));
    }
}
