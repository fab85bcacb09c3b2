//! Profiles: named sets of the operator's tunables, given as the flags the binary takes.
//!
//! - `unbounded`: the operator before the seed's fix: no connect timeout, no keepalive,
//!   no request bound, doubling backoff 1 s..60 s.
//! - `seed-fix`: the seed's fix: 10 s connect timeout, keepalive, 30 s request bound, and
//!   still the doubling backoff 1 s..60 s.
//!
//! Both keep modelling the old operator: one channel through the Service, no rotation, no
//! connect probe (so no hedged dials and no patience either).
//! - `default`: the operator's shipped defaults (no flags).

use std::fmt;
use std::str::FromStr;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Profile {
    Unbounded,
    SeedFix,
    Default,
}

impl Profile {
    pub const ALL: [Profile; 3] = [Profile::Unbounded, Profile::SeedFix, Profile::Default];

    pub fn name(self) -> &'static str {
        match self {
            Profile::Unbounded => "unbounded",
            Profile::SeedFix => "seed-fix",
            Profile::Default => "default",
        }
    }

    /// The operator flags of this profile.
    pub fn flags(self) -> Vec<&'static str> {
        // The seed's retry: doubling from 1 s to 60 s for every failure, no jitter.
        const DOUBLING_1S_60S: [&str; 8] = [
            "--retry-initial",
            "1s",
            "--retry-max",
            "60s",
            "--retry-jitter",
            "0",
            "--retry-transient",
            "off",
        ];
        let channel: &[&str] = match self {
            Profile::Unbounded => &[
                "--controller-max-in-flight",
                "off",
                "--controller-connect-timeout",
                "off",
                "--controller-request-timeout",
                "off",
                "--controller-keepalive-interval",
                "off",
                "--controller-channel-max-age",
                "off",
                "--controller-connect-probe",
                "off",
                "--submit-read-back",
                "off",
            ],
            Profile::SeedFix => &[
                "--controller-max-in-flight",
                "off",
                "--controller-connect-timeout",
                "10s",
                "--controller-request-timeout",
                "30s",
                // The seed fix pinged every 10 s and waited tonic's default 20 s for the
                // answer: a dead peer found 30 s after the last traffic. The operator's one
                // number is both, so 15 s gives the same 30 s.
                "--controller-keepalive-interval",
                "15s",
                "--controller-channel-max-age",
                "off",
                "--controller-connect-probe",
                "off",
                "--submit-read-back",
                "off",
            ],
            Profile::Default => return Vec::new(),
        };
        channel.iter().chain(&DOUBLING_1S_60S).copied().collect()
    }
}

impl fmt::Display for Profile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Profile {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Profile::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| format!("unknown profile `{s}` (unbounded, seed-fix, default)"))
    }
}
