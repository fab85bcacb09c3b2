//! The names the operator and the judge of its runs share: spurctld's job states as a
//! SpurJob's status shows them, and the tag by which a controller job names its SpurJob.
//! Plain text rules with no dependencies, so the judge can read a run without linking the
//! operator's runtime.

/// The comment tag that finds a submission again (the operator's `jobs::submit`).
pub const UID_TAG: &str = "spurjob-uid=";

/// The uid a JobSpec comment carries, if it carries one.
pub fn uid_in_comment(comment: &str) -> Option<&str> {
    comment
        .split([' ', ',', ';'])
        .find_map(|word| word.strip_prefix(UID_TAG))
        .filter(|uid| !uid.is_empty())
}

/// The ends this operator writes without spurctld's word: the spec cannot be submitted
/// (`Invalid`), spurctld refused the submission (`Refused`: INVALID_ARGUMENT,
/// FAILED_PRECONDITION, PERMISSION_DENIED), or spurctld no longer knows the job (`Lost`: it
/// evicts ended jobs after an hour, fidelity row 17). Each is written as upstream's state
/// `Failed` (the only names tooling written for upstream's operator knows), with the name
/// as the reason of the `Finished` and `Failed` conditions. Earlier versions wrote these
/// names as the state itself, so such a state is read as final too.
pub const INVALID_REASON: &str = "Invalid";
pub const REFUSED_REASON: &str = "Refused";
pub const LOST_REASON: &str = "Lost";
/// The operator's own ends, each read as final.
pub const OWN_ENDS: [&str; 3] = [INVALID_REASON, REFUSED_REASON, LOST_REASON];

/// Whether a state (as status shows it) is final. As spurctld has it: PREEMPTED and
/// REQUEUED end a run but send the job back to PENDING, so they are not final (the job
/// is still mirrored, and cancelled when its SpurJob is deleted). The names earlier
/// versions wrote count too (`COMPLETED`, `NODE_FAIL`, and our own `Invalid`, `Refused`,
/// `Lost`), so a job that ended before an upgrade is not polled again.
pub fn is_terminal(state: &str) -> bool {
    let folded: String = state
        .chars()
        .filter(|c| *c != '_')
        .map(|c| c.to_ascii_lowercase())
        .collect();
    matches!(
        folded.as_str(),
        "completed" | "failed" | "cancelled" | "timeout" | "nodefail" | "deadline" | "outofmemory"
    ) || OWN_ENDS.contains(&state)
}
