//! Each request message, with every declared field set, encodes to the bytes that
//! wire.md's field numbers and types dictate. The expected bytes are built by hand from
//! those numbers below, independently of the generated code, so a renumbered field, a
//! changed type (uint32 vs int32, a missing `optional`) or a wrong map shape fails here
//! before it fails against a real spurctld.

use std::collections::BTreeMap;

use prost::Message;
use spur_proto::*;

/// A protobuf writer that knows only wire types, so the expectations read as wire.md.
#[derive(Default)]
struct Wire(Vec<u8>);

impl Wire {
    fn key(mut self, field: u32, wire_type: u8) -> Self {
        put_varint(&mut self.0, (u64::from(field) << 3) | u64::from(wire_type));
        self
    }
    /// varint fields: uint32, uint64, bool, enums; int32 sign-extends to 64 bits.
    fn varint(self, field: u32, value: u64) -> Self {
        let mut w = self.key(field, 0);
        put_varint(&mut w.0, value);
        w
    }
    fn int32(self, field: u32, value: i32) -> Self {
        self.varint(field, i64::from(value) as u64)
    }
    fn bytes(self, field: u32, value: &[u8]) -> Self {
        let mut w = self.key(field, 2);
        put_varint(&mut w.0, value.len() as u64);
        w.0.extend_from_slice(value);
        w
    }
    fn string(self, field: u32, value: &str) -> Self {
        self.bytes(field, value.as_bytes())
    }
    fn message(self, field: u32, value: Wire) -> Self {
        self.bytes(field, &value.0)
    }
    /// A packed repeated varint field (proto3's default for scalars).
    fn packed(self, field: u32, values: &[u64]) -> Self {
        let mut body = Vec::new();
        for v in values {
            put_varint(&mut body, *v);
        }
        self.bytes(field, &body)
    }
    /// One map entry: a nested message with key = 1 and value = 2.
    fn string_entry(self, field: u32, key: &str, value: &str) -> Self {
        self.message(field, Wire::default().string(1, key).string(2, value))
    }
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn assert_golden(message: &impl Message, expected: Wire, what: &str) {
    assert_eq!(
        message.encode_to_vec(),
        expected.0,
        "{what} does not encode as wire.md says"
    );
}

#[test]
fn register_agent_request() {
    let message = RegisterAgentRequest {
        hostname: "gpu-node-1".into(),
        resources: Some(ResourceSet {
            cpus: 64,
            memory_mb: 515_000,
            gpus: vec![GpuResource {
                device_id: 3,
                gpu_type: "mi300x".into(),
                memory_mb: 196_608,
                peer_gpus: vec![0, 1],
                link_type: GpuLinkType::GpuLinkXgmi as i32,
            }],
            generic: [("nic".to_string(), 8u64)].into_iter().collect(),
        }),
        version: "spur-operator 0.1.0".into(),
        address: "10.1.2.3".into(),
        port: 6818,
        wg_pubkey: "wg".into(),
        labels: map(&[("zone", "a")]),
        join_token: "jt".into(),
    };
    let gpu = Wire::default()
        .varint(1, 3)
        .string(2, "mi300x")
        .varint(3, 196_608)
        .packed(4, &[0, 1])
        .varint(5, 1);
    let resources = Wire::default()
        .varint(1, 64)
        .varint(2, 515_000)
        .message(3, gpu)
        .message(4, Wire::default().string(1, "nic").varint(2, 8));
    let expected = Wire::default()
        .string(1, "gpu-node-1")
        .message(2, resources)
        .string(3, "spur-operator 0.1.0")
        .string(4, "10.1.2.3")
        .varint(5, 6818)
        .string(6, "wg")
        .string_entry(7, "zone", "a")
        .string(8, "jt");
    assert_golden(&message, expected, "RegisterAgentRequest");
}

#[test]
fn heartbeat_request() {
    let message = HeartbeatRequest {
        hostname: "gpu-node-1".into(),
        cpu_load: 12,
        free_memory_mb: 4096,
        running_jobs: vec![RunningJobStatus {
            job_id: 17,
            state: JobState::JobRunning as i32,
            exit_code: -1,
        }],
        node_token: "nt".into(),
        wg_pubkey: "wg".into(),
    };
    let running = Wire::default().varint(1, 17).varint(2, 1).int32(3, -1);
    let expected = Wire::default()
        .string(1, "gpu-node-1")
        .varint(2, 12)
        .varint(3, 4096)
        .message(4, running)
        .string(5, "nt")
        .string(6, "wg");
    assert_golden(&message, expected, "HeartbeatRequest");
}

#[test]
fn update_node_request_sends_explicit_idle() {
    // `state` is `optional`: IDLE (0) must still go on the wire, or spurctld could not
    // tell "set IDLE" from "leave the state alone".
    let message = UpdateNodeRequest {
        name: "gpu-node-1".into(),
        state: Some(NodeState::NodeIdle as i32),
        reason: Some(String::new()),
        labels: map(&[("spur.amd.com/pool", "a")]),
        remove_labels: vec!["old".into()],
    };
    let expected = Wire::default()
        .string(1, "gpu-node-1")
        .varint(2, 0)
        .string(3, "")
        .string_entry(4, "spur.amd.com/pool", "a")
        .string(5, "old");
    assert_golden(&message, expected, "UpdateNodeRequest");

    let down = UpdateNodeRequest {
        name: "n".into(),
        state: Some(NodeState::NodeDown as i32),
        reason: Some("NotReady".into()),
        ..Default::default()
    };
    let expected = Wire::default()
        .string(1, "n")
        .varint(2, 3)
        .string(3, "NotReady");
    assert_golden(&down, expected, "UpdateNodeRequest DOWN");
}

/// A JobSpec with every declared field set. A submission carries GPUs in one form only
/// (spurctld refuses a `gpu:` gres entry beside gpus_per_node), so gres holds another
/// resource; `nodelist` is what spurctld fills in a LaunchJob (empty in a submission).
fn full_job_spec(nodelist: &str) -> (JobSpec, Wire) {
    let spec = JobSpec {
        name: "train".into(),
        partition: "gpu".into(),
        account: "ml".into(),
        user: "alice".into(),
        num_nodes: 2,
        num_tasks: 16,
        tasks_per_node: 8,
        cpus_per_task: 4,
        memory_per_node_mb: 65_536,
        gres: vec!["rdma:1".into()],
        gpus_per_node: Some(GpuRequest {
            count: 8,
            gpu_type: "mi300x".into(),
        }),
        script: "#!/bin/sh".into(),
        argv: vec!["python".into(), "train.py".into()],
        work_dir: "/work".into(),
        environment: map(&[("A", "1")]),
        time_limit: Some(Duration {
            seconds: 3600,
            nanos: 0,
        }),
        qos: "high".into(),
        priority: 5,
        dependency: vec!["afterok:3".into()],
        nodelist: nodelist.into(),
        array_spec: "0-3".into(),
        comment: "spurjob-uid=abc".into(),
        host_network: true,
        privileged: true,
        host_ipc: true,
        shm_size: "16Gi".into(),
        container_image: "rocm/pytorch:latest".into(),
        container_mounts: vec!["/data:/data:ro".into()],
        container_env: map(&[("B", "2")]),
        extra_resources: map(&[("rdma", "1")]),
    };
    let wire = Wire::default()
        .string(1, "train")
        .string(2, "gpu")
        .string(3, "ml")
        .string(4, "alice")
        .varint(10, 2)
        .varint(11, 16)
        .varint(12, 8)
        .varint(13, 4)
        .varint(14, 65_536)
        .string(16, "rdma:1")
        .message(18, Wire::default().varint(1, 8).string(2, "mi300x"))
        .string(20, "#!/bin/sh")
        .string(21, "python")
        .string(21, "train.py")
        .string(22, "/work")
        .string_entry(25, "A", "1")
        .message(30, Wire::default().varint(1, 3600))
        .string(40, "high")
        .varint(41, 5)
        .string(43, "afterok:3");
    // proto3 leaves an empty string off the wire.
    let wire = if nodelist.is_empty() {
        wire
    } else {
        wire.string(44, nodelist)
    };
    let wire = wire
        .string(50, "0-3")
        .string(63, "spurjob-uid=abc")
        .varint(66, 1)
        .varint(67, 1)
        .varint(68, 1)
        .string(69, "16Gi")
        .string(70, "rocm/pytorch:latest")
        .string(71, "/data:/data:ro")
        .string_entry(76, "B", "2")
        .string_entry(80, "rdma", "1");
    (spec, wire)
}

#[test]
fn submit_job_request() {
    let (spec, wire) = full_job_spec("");
    let message = SubmitJobRequest { spec: Some(spec) };
    assert_golden(
        &message,
        Wire::default().message(1, wire),
        "SubmitJobRequest",
    );
}

#[test]
fn job_queries_and_cancel() {
    assert_golden(
        &GetJobRequest { job_id: 300 },
        Wire::default().varint(1, 300),
        "GetJobRequest",
    );
    let get_jobs = GetJobsRequest {
        states: vec![JobState::JobPending as i32, JobState::JobRequeued as i32],
        user: "alice".into(),
        partition: "gpu".into(),
        account: "ml".into(),
        job_ids: vec![1, 2],
        name: "train".into(),
    };
    let expected = Wire::default()
        .packed(1, &[0, 12])
        .string(2, "alice")
        .string(3, "gpu")
        .string(4, "ml")
        .packed(5, &[1, 2])
        .string(6, "train");
    assert_golden(&get_jobs, expected, "GetJobsRequest");
    let cancel = CancelJobRequest {
        job_id: 9,
        signal: 15,
        user: "alice".into(),
    };
    let expected = Wire::default().varint(1, 9).int32(2, 15).string(3, "alice");
    assert_golden(&cancel, expected, "CancelJobRequest");
}

/// `spur token create` and `revoke` (ROCm/spur proto/slurm.proto): `ttl_secs` is an
/// optional uint32, so an explicit 0 is on the wire.
#[test]
fn join_token_calls() {
    assert_golden(
        &CreateTokenRequest { ttl_secs: Some(0) },
        Wire::default().varint(1, 0),
        "CreateTokenRequest",
    );
    assert_golden(
        &RevokeTokenRequest {
            token_id: "a1b2c3".into(),
        },
        Wire::default().string(1, "a1b2c3"),
        "RevokeTokenRequest",
    );
    let created = Wire::default().string(1, "a1b2c3.ff").string(2, "a1b2c3");
    let created = CreateTokenResponse::decode(created.0.as_slice()).unwrap();
    assert_eq!(
        (created.token.as_str(), created.token_id.as_str()),
        ("a1b2c3.ff", "a1b2c3")
    );
}

#[test]
fn get_nodes_the_lab_reads() {
    // spurctld's numbers: GetNodesRequest {states 1, partition 2, nodelist 3}, NodeInfo
    // {name 1, state 2, state_reason 3, ...}; the lab reads only these.
    let request = GetNodesRequest {
        states: vec![NodeState::NodeDown as i32],
        partition: "gpu".into(),
        nodelist: "node-[0-3]".into(),
    };
    let expected = Wire::default()
        .packed(1, &[3])
        .string(2, "gpu")
        .string(3, "node-[0-3]");
    assert_golden(&request, expected, "GetNodesRequest");
    let reply = Wire::default().message(
        1,
        Wire::default()
            .string(1, "node-0")
            .varint(2, 4)
            .string(3, "drained by the operator")
            // total_resources and the rest, which the lab does not declare.
            .message(10, Wire::default().varint(1, 64)),
    );
    let decoded = GetNodesResponse::decode(reply.0.as_slice()).unwrap();
    assert_eq!(decoded.nodes.len(), 1);
    assert_eq!(decoded.nodes[0].name, "node-0");
    assert_eq!(decoded.nodes[0].state(), NodeState::NodeDrain);
    assert_eq!(decoded.nodes[0].state_reason, "drained by the operator");
}

#[test]
fn report_job_status_request() {
    let message = ReportJobStatusRequest {
        job_id: 9,
        state: JobState::JobFailed as i32,
        exit_code: -9,
        message: "OOMKilled".into(),
        drain_node: true,
        drain_reason: "gpu fault".into(),
        reporting_node: "gpu-node-1".into(),
        signal: 9,
        run_attempt: 2,
    };
    let expected = Wire::default()
        .varint(1, 9)
        .varint(2, 4)
        .int32(3, -9)
        .string(4, "OOMKilled")
        .varint(5, 1)
        .string(6, "gpu fault")
        .string(7, "gpu-node-1")
        .int32(8, 9)
        .varint(9, 2);
    assert_golden(&message, expected, "ReportJobStatusRequest");
}

#[test]
fn agent_requests() {
    // As spurctld sends it: the names in spec.nodelist, in rank order; peer_nodes the agent
    // sockets (one operator: all the same); task_offset = rank × tasks_per_node (8).
    let (spec, spec_wire) = full_job_spec("gpu-node-1,gpu-node-2");
    let allocated = ResourceAllocations {
        cpus: 32,
        memory_mb: 65_536,
        devices: [(
            "gpu".to_string(),
            DeviceAllocations {
                devices: vec![AllocatedDevice {
                    device_id: 2,
                    count: 1,
                }],
            },
        )]
        .into_iter()
        .collect(),
    };
    let message = LaunchJobRequest {
        job_id: 9,
        spec: Some(spec),
        allocated: Some(allocated),
        peer_nodes: vec!["10.0.0.5:6818".into(), "10.0.0.5:6818".into()],
        task_offset: 8,
        target_node: "gpu-node-2".into(),
        array_job_id: 4,
        array_task_id: 1,
        run_attempt: 2,
    };
    let devices = Wire::default().message(1, Wire::default().varint(1, 2).varint(2, 1));
    let allocated = Wire::default()
        .varint(1, 32)
        .varint(2, 65_536)
        .message(3, Wire::default().string(1, "gpu").message(2, devices));
    let expected = Wire::default()
        .varint(1, 9)
        .message(2, spec_wire)
        .message(3, allocated)
        .string(4, "10.0.0.5:6818")
        .string(4, "10.0.0.5:6818")
        .varint(5, 8)
        .string(6, "gpu-node-2")
        .varint(7, 4)
        .varint(8, 1)
        .varint(9, 2);
    assert_golden(&message, expected, "LaunchJobRequest");

    let cancel = AgentCancelJobRequest {
        job_id: 9,
        signal: 0,
    };
    assert_golden(
        &cancel,
        Wire::default().varint(1, 9),
        "AgentCancelJobRequest",
    );
}

#[test]
fn answers_decode_from_wire_md_numbers() {
    // The operator reads these; decode hand-built bytes and check each field landed.
    let info = Wire::default()
        .varint(1, 12)
        .string(2, "train")
        .string(3, "alice")
        .string(5, "gpu")
        .string(6, "ml")
        .varint(7, 3)
        .string(8, "None")
        .message(10, Wire::default().varint(1, 100))
        .message(11, Wire::default().varint(1, 110))
        .message(12, Wire::default().varint(1, 120))
        .varint(20, 2)
        .string(23, "a,b")
        .int32(30, -1)
        .string(53, "spurjob-uid=abc")
        // A field the operator does not declare is skipped, not an error.
        .string(99, "unknown to us");
    let decoded = JobInfo::decode(info.0.as_slice()).unwrap();
    assert_eq!(decoded.job_id, 12);
    assert_eq!(decoded.name, "train");
    assert_eq!(decoded.user, "alice");
    assert_eq!(decoded.partition, "gpu");
    assert_eq!(decoded.account, "ml");
    assert_eq!(decoded.state(), JobState::JobCompleted);
    assert_eq!(decoded.state_reason, "None");
    assert_eq!(decoded.submit_time.unwrap().seconds, 100);
    assert_eq!(decoded.start_time.unwrap().seconds, 110);
    assert_eq!(decoded.end_time.unwrap().seconds, 120);
    assert_eq!(decoded.num_nodes, 2);
    assert_eq!(decoded.nodelist, "a,b");
    assert_eq!(decoded.exit_code, -1);
    assert_eq!(decoded.comment, "spurjob-uid=abc");

    let ping = Wire::default()
        .string(1, "spurctld-0")
        .message(2, Wire::default().varint(1, 5))
        .string(3, "0.9.0");
    let ping = PingResponse::decode(ping.0.as_slice()).unwrap();
    assert_eq!(
        (ping.hostname.as_str(), ping.version.as_str()),
        ("spurctld-0", "0.9.0")
    );
    let registered = Wire::default()
        .varint(1, 1)
        .string(2, "ok")
        .string(3, "tok");
    let registered = RegisterAgentResponse::decode(registered.0.as_slice()).unwrap();
    assert!(registered.accepted);
    assert_eq!(registered.node_token, "tok");
    let submitted = Wire::default().varint(1, 77).string(2, "w");
    let submitted = SubmitJobResponse::decode(submitted.0.as_slice()).unwrap();
    assert_eq!((submitted.job_id, submitted.warnings.len()), (77, 1));
    let launched = Wire::default()
        .varint(1, 1)
        .string(2, "e")
        .string(3, "o")
        .string(4, "x");
    let launched = LaunchJobResponse::decode(launched.0.as_slice()).unwrap();
    assert!(launched.success && launched.error == "e" && launched.stderr_path == "x");
}

#[test]
fn service_paths_are_in_package_slurm() {
    // Paths are what a real spurctld routes by: /slurm.SlurmController/<Method>.
    assert_eq!(
        slurm_controller_server::SERVICE_NAME,
        "slurm.SlurmController"
    );
    assert_eq!(slurm_agent_server::SERVICE_NAME, "slurm.SlurmAgent");
}

/// The agent calls served beside LaunchJob and CancelJob, with upstream's field numbers
/// (ROCm/spur proto/slurm.proto): what spurctld and spur's CLI send, and what they decode.
#[test]
fn the_agents_other_calls() {
    let suspend = AgentSuspendJobRequest {
        job_id: 9,
        resume: true,
    };
    assert_golden(
        &suspend,
        Wire::default().varint(1, 9).varint(2, 1),
        "AgentSuspendJobRequest",
    );
    let exec = ExecInJobRequest {
        job_id: 9,
        command: vec!["rocm-smi".into(), "-a".into()],
        user: "alice".into(),
    };
    let expected = Wire::default()
        .varint(1, 9)
        .string(2, "rocm-smi")
        .string(2, "-a")
        .string(3, "alice");
    assert_golden(&exec, expected, "ExecInJobRequest");
    let answer = ExecInJobResponse {
        success: false,
        exit_code: -1,
        stdout: "o".into(),
        stderr: "e".into(),
    };
    let expected = Wire::default().int32(2, -1).string(3, "o").string(4, "e");
    assert_golden(&answer, expected, "ExecInJobResponse");
    let stream = StreamJobOutputRequest {
        job_id: 9,
        stream: "stdout".into(),
        user: "alice".into(),
    };
    let expected = Wire::default()
        .varint(1, 9)
        .string(2, "stdout")
        .string(3, "alice");
    assert_golden(&stream, expected, "StreamJobOutputRequest");
    let chunk = StreamJobOutputChunk {
        data: b"loss=0.25\n".to_vec(),
        eof: true,
    };
    let expected = Wire::default().bytes(1, b"loss=0.25\n").varint(2, 1);
    assert_golden(&chunk, expected, "StreamJobOutputChunk");
    let resources = NodeResourcesResponse {
        total: Some(ResourceSet {
            cpus: 8,
            ..Default::default()
        }),
        used: Some(ResourceAllocations {
            cpus: 2,
            ..Default::default()
        }),
    };
    let expected = Wire::default()
        .message(1, Wire::default().varint(1, 8))
        .message(2, Wire::default().varint(1, 2));
    assert_golden(&resources, expected, "NodeResourcesResponse");
    // PreparePmixRequest's plan (field 2) is not declared: a request carrying one decodes.
    let sent = Wire::default()
        .varint(1, 9)
        .message(2, Wire::default().string(1, "plan"))
        .varint(3, 2);
    let prepare = PreparePmixRequest::decode(sent.0.as_slice()).expect("decodes");
    assert_eq!((prepare.job_id, prepare.run_attempt), (9, 2));
    let suspend_at_controller = SuspendJobRequest {
        job_id: 9,
        user: "alice".into(),
    };
    let expected = Wire::default().varint(1, 9).string(2, "alice");
    assert_golden(&suspend_at_controller, expected, "SuspendJobRequest");
}
