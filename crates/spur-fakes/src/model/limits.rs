//! spurctld's size limits (docs/specs.md, fidelity rows 16 and 21): requests decoded up to
//! 8 MiB, responses encoded up to 32 MiB, and a submission refused when its spec, as
//! spurctld serializes it (JSON), exceeds 4 MiB.

use spur_operator::net::Dialer;
use spur_proto::SlurmControllerServer;
use tonic::Status;

use super::Replica;
use spur_proto as pb;

/// The largest request spurctld's server decodes (`MAX_GRPC_REQUEST_SIZE`); a longer one
/// is refused by tonic's decoder, OUT_OF_RANGE.
pub const MAX_REQUEST_BYTES: usize = 8 * 1024 * 1024;
/// The largest response spurctld's server encodes and its clients decode
/// (`MAX_GRPC_MESSAGE_SIZE`).
pub const MAX_RESPONSE_BYTES: usize = 32 * 1024 * 1024;
/// The largest serialized spec SubmitJob takes (`MAX_JOB_SPEC_SIZE`).
pub const MAX_SPEC_BYTES: usize = 4 * 1024 * 1024;
/// What spurctld's JSON of a spec holds beyond the strings the model counts: its keys,
/// numbers and nulls. Measured on the real binary: a spec of the conformance suite
/// (name `conf-size`, its comment, default partition and work dir) is taken with a
/// script of 4 193 032 bytes and refused with one byte more.
const SPEC_JSON_OVERHEAD: usize = 1231;

/// A string's length as serde_json writes it, without its quotes: `"`, `\` and the
/// short-escaped controls take two bytes, other controls six (`\u0001`).
fn json_len(text: &str) -> usize {
    text.bytes()
        .map(|b| match b {
            b'"' | b'\\' | b'\n' | b'\r' | b'\t' | 0x08 | 0x0c => 2,
            0..=0x1f => 6,
            _ => 1,
        })
        .sum()
}

fn list_len(items: &[String]) -> usize {
    items.iter().map(|item| json_len(item) + 3).sum()
}

fn map_len<'a>(entries: impl Iterator<Item = (&'a String, &'a String)>) -> usize {
    entries.map(|(k, v)| json_len(k) + json_len(v) + 6).sum()
}

/// About the bytes spurctld's JSON of `spec` takes, after it filled in the default
/// partition and work dir.
pub fn submission_size(spec: &pb::JobSpec) -> usize {
    let strings = [
        &spec.name,
        &spec.account,
        &spec.user,
        &spec.script,
        &spec.qos,
        &spec.nodelist,
        &spec.array_spec,
        &spec.comment,
        &spec.shm_size,
        &spec.container_image,
    ];
    SPEC_JSON_OVERHEAD
        + strings.iter().map(|s| json_len(s)).sum::<usize>()
        + json_len(or_default(&spec.partition, "default"))
        + json_len(or_default(&spec.work_dir, "/tmp"))
        + list_len(&spec.gres)
        + list_len(&spec.argv)
        + list_len(&spec.dependency)
        + list_len(&spec.container_mounts)
        + map_len(spec.environment.iter())
        + map_len(spec.container_env.iter())
        + map_len(spec.extra_resources.iter())
}

/// `value`, or spurctld's `default` for it when it is empty.
fn or_default<'a>(value: &'a str, default: &'a str) -> &'a str {
    if value.is_empty() { default } else { value }
}

/// SubmitJob's size refusal, in spurctld's words (INVALID_ARGUMENT).
pub fn check_submission_size(spec: &pb::JobSpec) -> Result<(), Status> {
    let size = submission_size(spec);
    if size <= MAX_SPEC_BYTES {
        return Ok(());
    }
    Err(Status::invalid_argument(format!(
        "job submission too large: {:.1} MiB serialized, limit is {} MiB (reduce script, environment, or argv size)",
        size as f64 / (1024.0 * 1024.0),
        MAX_SPEC_BYTES / (1024 * 1024),
    )))
}

/// `replica` served with spurctld's message limits.
pub fn server<D: Dialer>(replica: Replica<D>) -> SlurmControllerServer<Replica<D>> {
    SlurmControllerServer::new(replica)
        .max_decoding_message_size(MAX_REQUEST_BYTES)
        .max_encoding_message_size(MAX_RESPONSE_BYTES)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_count_as_serde_json_writes_them() {
        assert_eq!(json_len("ab"), 2);
        assert_eq!(json_len("a\n\"\\"), 7);
        assert_eq!(json_len("\u{1}"), 6);
        assert_eq!(json_len("é"), 2);
    }
}
