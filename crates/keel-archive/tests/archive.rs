//! Behaviour of the archive format through its public API: writing and
//! reading files, torn tails, corruption, folding and materialising.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use keel_archive::{
    Archive, ArchiveWriter, Checkpoint, Diff, Error, FORMAT_VERSION, Header, Owner, Ownership, Record, RunState,
    TurnChange, write_frame, write_preamble,
};
use keel_protocol::session::{SessionInfo, ToolCallInfo};
use keel_protocol::{CompactionSettings, ImageRef, Item, ToolCallStatus, TurnStatus, Usage};

fn session_info() -> SessionInfo {
    SessionInfo {
        id: "ses_1".into(),
        name: "demo".into(),
        coworker: "writer".into(),
        bundle_path: "/bundles/writer".into(),
        bundle_digest: "sha256:abc".into(),
        coworker_spec: Arc::new(serde_json::json!({"name": "writer"})),
        workspace: "/work".into(),
        attended: true,
        compaction: CompactionSettings::default(),
        provider_blocked: false,
        created_at_ms: 1,
        updated_at_ms: 1,
        current_turn_id: None,
        history_len: 0,
        usage: Usage::default(),
        labels: Default::default(),
        owner: None,
    }
}

fn owner(n: u32) -> Owner {
    Owner { machine_id: format!("m{n}"), process_id: n, instance_id: format!("inst{n}") }
}

fn header() -> Header {
    let o = owner(1);
    Header {
        session_id: "ses_1".into(),
        machine_id: o.machine_id,
        process_id: o.process_id,
        instance_id: o.instance_id,
        keel_version: "0.1.0".into(),
        created_at_ms: 10,
    }
}

fn empty_state() -> RunState {
    RunState {
        session: session_info(),
        turns: Vec::new(),
        history: Vec::new(),
        usage: Usage::default(),
        interactions: Vec::new(),
        compaction: None,
        tool_calls: Vec::new(),
        owner: Some(owner(1)),
        seq: 1,
    }
}

fn usage(tokens: u64) -> Usage {
    Usage { input_tokens: tokens, output_tokens: 1, ..Usage::default() }
}

/// A checkpoint at seq 1, a turn with a tool call (seqs 2..=6), an ownership
/// change at 6, and the turn's end at 7.
fn records() -> Vec<Record> {
    let turn = |status, submission: Option<&str>| {
        Some(TurnChange { turn_id: "turn_1".into(), status, submission_id: submission.map(Into::into) })
    };
    let call = |status| ToolCallInfo {
        session_id: "ses_1".into(),
        call_id: "c1".into(),
        turn_id: "turn_1".into(),
        name: "read_file".into(),
        arguments: "{}".into(),
        status,
        output: None,
        is_error: false,
        started_at_ms: 4,
        finished_at_ms: None,
    };
    let diff = |seq, kind: &str| Diff { seq, at_ms: seq as i64 * 10, kind: kind.into(), ..Diff::default() };
    vec![
        Record::from(Checkpoint { seq: 1, state: empty_state() }),
        Record::from(Diff { turn: turn(TurnStatus::Running, Some("sub_1")), ..diff(2, "turn_started") }),
        Record::from(Diff { items: vec![(0, Item::user_text("read it"))], ..diff(3, "item_added") }),
        Record::from(Diff {
            items: vec![(
                1,
                Item::FunctionCall { call_id: "c1".into(), name: "read_file".into(), arguments: "{}".into() },
            )],
            usage: Some(usage(5)),
            tool_call: Some(call(ToolCallStatus::Started)),
            ..diff(4, "tool_call_started")
        }),
        Record::from(Diff {
            items: vec![(
                2,
                Item::FunctionCallOutput {
                    call_id: "c1".into(),
                    output: "text".into(),
                    images: vec![ImageRef { id: "img_1".into(), mime_type: "image/png".into(), bytes: 9 }],
                },
            )],
            tool_call: Some(call(ToolCallStatus::Completed)),
            ..diff(5, "tool_call_finished")
        }),
        Record::from(Diff { turn: turn(TurnStatus::Interrupted, None), ..diff(6, "turn_interrupted") }),
        Record::Ownership(Ownership { seq: 6, at_ms: 65, from: owner(1), to: owner(2) }),
        Record::from(Diff {
            items: vec![(3, Item::assistant_text("done"))],
            usage: Some(usage(7)),
            turn: turn(TurnStatus::Completed, None),
            ..diff(7, "turn_finished")
        }),
    ]
}

fn archive_bytes(records: &[Record]) -> Vec<u8> {
    let mut bytes = Vec::new();
    write_preamble(&mut bytes).unwrap();
    write_frame(&mut bytes, &Record::Header(header())).unwrap();
    for record in records {
        write_frame(&mut bytes, record).unwrap();
    }
    bytes
}

/// Byte offsets where each frame starts (header frame first).
fn frame_starts(bytes: &[u8]) -> Vec<usize> {
    let mut starts = Vec::new();
    let mut pos = 12;
    while pos < bytes.len() {
        starts.push(pos);
        let len = u32::from_le_bytes(bytes[pos..pos + 4].try_into().unwrap()) as usize;
        pos += 8 + len;
    }
    starts
}

#[test]
fn a_written_file_reads_back_equal() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.keel");
    let mut writer = ArchiveWriter::create(&path, &header()).unwrap();
    assert!(!path.exists(), "the final name appears only on finish");
    for record in records() {
        writer.append(&record).unwrap();
    }
    writer.finish().unwrap();
    let archive = Archive::read(&path).unwrap();
    assert_eq!(archive.header, header());
    assert_eq!(archive.records, records());
    assert_eq!(archive.torn_tail, None);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "no temporary file is left");
    assert_eq!(std::fs::read(&path).unwrap(), archive_bytes(&records()));
}

#[test]
fn an_unfinished_writer_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.keel");
    let mut writer = ArchiveWriter::create(&path, &header()).unwrap();
    writer.append(&records()[0]).unwrap();
    drop(writer);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn fold_is_the_last_point_and_every_point_materialises() {
    let archive = Archive::from_bytes(&archive_bytes(&records())).unwrap();
    assert_eq!(archive.points(), vec![1, 2, 3, 4, 5, 6, 7]);
    let folded = archive.fold().unwrap();
    assert_eq!(folded, archive.materialize(7).unwrap());
    assert_eq!(folded.usage, usage(5).tap_add(&usage(7)));
    assert_eq!(folded.session.usage, folded.usage);
    assert_eq!(folded.session.current_turn_id.as_deref(), Some("turn_1"));
    assert_eq!(folded.tool_calls.len(), 1);
    assert_eq!(folded.tool_calls[0].status, ToolCallStatus::Completed);
    assert_eq!(folded.turns[0].submission_id.as_deref(), Some("sub_1"));
    assert_eq!(archive.owners(), vec![owner(1), owner(2)]);

    let expected: [(u64, usize, Option<TurnStatus>, Option<Owner>); 7] = [
        (1, 0, None, Some(owner(1))),
        (2, 0, Some(TurnStatus::Running), Some(owner(1))),
        (3, 1, Some(TurnStatus::Running), Some(owner(1))),
        (4, 2, Some(TurnStatus::Running), Some(owner(1))),
        (5, 3, Some(TurnStatus::Running), Some(owner(1))),
        (6, 3, Some(TurnStatus::Interrupted), Some(owner(2))),
        (7, 4, Some(TurnStatus::Completed), Some(owner(2))),
    ];
    for (seq, history_len, status, owner) in expected {
        let state = archive.materialize(seq).unwrap();
        assert_eq!(state.seq, seq);
        assert_eq!(state.history.len(), history_len, "history at seq {seq}");
        assert_eq!(state.session.history_len, history_len as u64);
        assert_eq!(state.turns.first().map(|t| t.status), status, "turn status at seq {seq}");
        assert_eq!(state.owner, owner, "owner at seq {seq}");
    }
    let err = archive.materialize(9).unwrap_err();
    assert!(matches!(err, Error::NoSuchPoint { seq: 9, .. }));
    assert!(err.to_string().contains("the last is 7"), "{err}");
}

#[test]
fn a_later_checkpoint_restarts_the_fold() {
    let mut with_checkpoint = records();
    let at_four = Archive::from_bytes(&archive_bytes(&with_checkpoint)).unwrap().materialize(4).unwrap();
    with_checkpoint.insert(4, Record::from(Checkpoint { seq: 4, state: at_four }));
    let archive = Archive::from_bytes(&archive_bytes(&with_checkpoint)).unwrap();
    let plain = Archive::from_bytes(&archive_bytes(&records())).unwrap();
    assert_eq!(archive.fold().unwrap(), plain.fold().unwrap());
    for seq in plain.points() {
        assert_eq!(archive.materialize(seq).unwrap(), plain.materialize(seq).unwrap(), "seq {seq}");
    }
}

#[test]
fn a_torn_tail_at_every_offset_of_the_last_frame_keeps_the_rest() {
    let bytes = archive_bytes(&records());
    let last = *frame_starts(&bytes).last().unwrap();
    let kept = records()[..records().len() - 1].to_vec();
    let whole = Archive::from_bytes(&bytes[..last]).unwrap();
    assert_eq!((whole.records.clone(), whole.torn_tail), (kept.clone(), None));
    for cut in last + 1..bytes.len() {
        let archive = Archive::from_bytes(&bytes[..cut]).unwrap_or_else(|e| panic!("cut at {cut}: {e}"));
        assert_eq!(archive.records, kept, "cut at {cut}");
        assert_eq!(archive.torn_tail.map(|t| t.offset), Some(last as u64), "cut at {cut}");
    }
    let mut bad_checksum = bytes.clone();
    *bad_checksum.last_mut().unwrap() ^= 0xff;
    let archive = Archive::from_bytes(&bad_checksum).unwrap();
    assert_eq!(archive.records, kept);
    assert!(archive.torn_tail.unwrap().reason.contains("checksum"));
    let mut zeros = bytes[..last].to_vec();
    zeros.extend([0u8; 4096]);
    assert_eq!(Archive::from_bytes(&zeros).unwrap().records, kept);
}

#[test]
fn a_flipped_byte_in_a_middle_frame_is_corruption_at_its_offset() {
    let bytes = archive_bytes(&records());
    let starts = frame_starts(&bytes);
    let middle = starts[3];
    let mut flipped = bytes.clone();
    flipped[middle + 20] ^= 0x01;
    match Archive::from_bytes(&flipped) {
        Err(Error::Corrupt { offset, reason }) => {
            assert_eq!(offset, middle as u64);
            assert!(reason.contains("checksum"), "{reason}");
        }
        other => panic!("expected corruption, got {other:?}"),
    }
}

#[test]
fn foreign_and_newer_files_are_refused_clearly() {
    let mut bytes = archive_bytes(&records());
    bytes[..8].copy_from_slice(b"SQLite f");
    let err = Archive::from_bytes(&bytes).unwrap_err();
    assert!(matches!(err, Error::NotAnArchive { .. }));
    assert!(err.to_string().contains("not a keel archive"), "{err}");

    let mut newer = archive_bytes(&records());
    newer[8..10].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
    let err = Archive::from_bytes(&newer).unwrap_err();
    assert!(matches!(err, Error::UnsupportedVersion { found: 2, supported: 1 }));
    assert!(err.to_string().contains("version 2") && err.to_string().contains("version 1"), "{err}");

    let only_preamble = &archive_bytes(&[])[..12];
    assert!(matches!(Archive::from_bytes(only_preamble), Err(Error::MissingHeader { .. })));
    let torn_header = &archive_bytes(&[])[..20];
    assert!(matches!(Archive::from_bytes(torn_header), Err(Error::MissingHeader { .. })));
}

#[test]
fn append_to_cuts_a_torn_tail_then_appends() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.keel");
    let bytes = archive_bytes(&records());
    let last = *frame_starts(&bytes).last().unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 3]).unwrap();

    let takeover = Record::Ownership(Ownership { seq: 7, at_ms: 80, from: owner(2), to: owner(3) });
    let mut writer = ArchiveWriter::append_to(&path).unwrap();
    writer.append(&takeover).unwrap();
    writer.finish().unwrap();

    let archive = Archive::read(&path).unwrap();
    assert_eq!(archive.torn_tail, None);
    let mut expected = records()[..records().len() - 1].to_vec();
    expected.push(takeover.clone());
    assert_eq!(archive.records, expected);
    let mut expected_bytes = bytes[..last].to_vec();
    write_frame(&mut expected_bytes, &takeover).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), expected_bytes);
    assert!(matches!(
        ArchiveWriter::append_to(&path).unwrap().append(&Record::Header(header())),
        Err(Error::SecondHeader)
    ));
}

#[test]
fn an_index_gap_in_a_diff_is_an_error() {
    let mut state = empty_state();
    let gap = Record::from(Diff {
        seq: 2,
        kind: "item_added".into(),
        items: vec![(1, Item::user_text("x"))],
        ..Diff::default()
    });
    assert!(matches!(state.apply(&gap), Err(Error::IndexGap { seq: 2, expected: 0, found: 1 })));
    assert_eq!(state, empty_state(), "a refused diff changes nothing");
    assert!(matches!(state.apply(&Record::Header(header())), Err(Error::NotApplicable { kind: "header" })));

    let mut bad = records();
    bad.push(Record::from(Diff {
        seq: 8,
        kind: "item_added".into(),
        items: vec![(9, Item::user_text("x"))],
        ..Diff::default()
    }));
    let archive = Archive::from_bytes(&archive_bytes(&bad)).unwrap();
    assert!(matches!(archive.fold(), Err(Error::IndexGap { seq: 8, expected: 4, found: 9 })));
}

#[test]
fn the_writer_refuses_image_data() {
    let leaked = Record::from(Diff {
        seq: 2,
        kind: "item_added".into(),
        items: vec![(0, Item::tool_output("c1", "data:image/png;base64,iVBORw0KGgoAAAANSUhEUg=="))],
        ..Diff::default()
    });
    let mut sink = Vec::new();
    assert!(matches!(write_frame(&mut sink, &leaked), Err(Error::ImageData { kind: "diff" })));
    assert!(sink.is_empty());

    let dir = tempfile::tempdir().unwrap();
    let mut writer = ArchiveWriter::create(dir.path().join("run.keel"), &header()).unwrap();
    let err = writer.append(&leaked).unwrap_err();
    assert!(err.to_string().contains("data:image/"), "{err}");
}

/// `Usage::add` returning the sum, for expected values.
trait TapAdd {
    fn tap_add(self, other: &Usage) -> Usage;
}

impl TapAdd for Usage {
    fn tap_add(mut self, other: &Usage) -> Usage {
        self.add(other);
        self
    }
}
