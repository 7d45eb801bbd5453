use super::packed::{BareBlock, Packed, CHUNK_ROWS, CHUNK_TEXT};
use super::*;
use msmemscope_core::events::abi::{BlockAttrs, StrRef};
use msmemscope_core::events::{DeviceId, Event, EventType};

fn numbers(event: Event, ptr: u64) -> Numbers {
    Numbers {
        event,
        event_type: EventType::Pta,
        ts_ns: 7,
        pid: 11,
        tid: 13,
        device: DeviceId::Cuda(1),
        ptr: Some(ptr),
    }
}

fn texts<'a>(name: &'a [u8], attrs: Option<&'a [u8]>, stack: &'a [u8]) -> Texts<'a> {
    Texts {
        name,
        attrs: attrs.map_or(Attrs::None, Attrs::Json),
        python_stack: stack,
    }
}

/// A whole STEP row named `name`, stamped `ts_ns`, numbered `seq`.
fn step_row(name: &str, ts_ns: u64, seq: u64) -> Queued {
    let mut row = EventRow::new(Event::System, EventType::Step, name);
    row.ts_ns = ts_ns;
    Queued {
        seq,
        row,
        c_frames: Vec::new(),
        attrs_spare: String::new(),
    }
}

/// Every row written so far: (sequence number, row, C frames), cloned out of the reused one.
fn write_all(backlog: &mut Backlog, buffers: &[Arc<ThreadBuffer>]) -> Vec<Queued> {
    backlog.refill_from(buffers);
    let mut out = Vec::new();
    backlog.write_until(u64::MAX, |q| {
        out.push(Queued {
            seq: q.seq,
            row: q.row.clone(),
            c_frames: q.c_frames.clone(),
            attrs_spare: String::new(),
        })
    });
    out
}

#[test]
fn packed_rows_come_back_whole_and_reused_rows_carry_nothing_over() {
    let buffer = Arc::new(ThreadBuffer::default());
    let buffers = [buffer.clone()];
    let mut backlog = Backlog::default();
    let first = texts(
        b"aten::addmm",
        Some(br#"{"size":1024,"owner":"PTA@weight"}"#),
        b"t.py(3): f\nt.py(9): <module>",
    );
    assert!(buffer.push_packed(2, numbers(Event::Malloc, 0x10), &first, &[0xa, 0xb]));
    assert!(buffer.push_row(step_row("1", 7, 1)).is_none());
    let out = write_all(&mut backlog, &buffers);
    assert!(!buffer.has_rows());
    // Whole rows and packed ones are written in the order of (time, sequence number).
    let [b, a] = &out[..] else {
        panic!("{} rows", out.len())
    };
    assert_eq!((b.seq, a.seq), (1, 2));
    assert_eq!(a.row.name, "aten::addmm");
    assert_eq!((a.row.ts_ns, a.row.pid, a.row.tid), (7, 11, 13));
    assert_eq!((a.row.device, a.row.ptr), (DeviceId::Cuda(1), Some(0x10)));
    assert_eq!(a.row.attr_u64("size"), Some(1024));
    assert_eq!(a.row.python_stack, "t.py(3): f\nt.py(9): <module>");
    assert_eq!(a.c_frames, vec![0xa, 0xb]);
    assert_eq!(b.row.name, "1");

    // The next rows are read into the same row as the first: the new values are read,
    // and nothing of the old row stays.
    let second = texts(
        b"aten::mm",
        Some(br#"{"size":2048,"owner":"PTA@weight"}"#),
        b"",
    );
    assert!(buffer.push_packed(3, numbers(Event::Free, 0x20), &second, &[]));
    assert!(buffer.push_packed(
        4,
        numbers(Event::Free, 0x30),
        &texts(b"N/A", None, b"\xff"),
        &[]
    ));
    let out = write_all(&mut backlog, &buffers);
    let [c, d] = &out[..] else {
        panic!("{} rows", out.len())
    };
    assert_eq!(
        (c.row.event, c.row.name.as_str()),
        (Event::Free, "aten::mm")
    );
    assert_eq!(c.row.attr_u64("size"), Some(2048));
    assert_eq!((c.row.python_stack.as_str(), c.c_frames.len()), ("", 0));
    assert_eq!(
        (d.row.name.as_str(), d.row.attrs_json.as_deref()),
        ("N/A", None)
    );
    assert!(d.row.attrs.is_empty() && d.row.c_stack.is_empty());
    assert_eq!(d.row.ptr, Some(0x30));
    // Bytes that are not UTF-8 are read, on the writer's side, with the replacement char.
    assert_eq!(d.row.python_stack, "\u{fffd}");
}

/// An op row keeps its interned name's address: it comes back as the row a copied name
/// makes (no device, no Ptr, no texts), in queueing order with the rows around it, and
/// a following block row is unaffected by it. A name no span can measure goes copied.
#[test]
fn op_rows_keep_the_address_of_their_interned_name() {
    static NAME: &[u8] = b"aten::addmm.default";
    let buffer = Arc::new(ThreadBuffer::default());
    let mut backlog = Backlog::default();
    let op = |event_type, ts_ns| OpRow {
        event_type,
        name: NAME,
        ts_ns,
        pid: 11,
        tid: 13,
    };
    assert!(buffer.push_op(1, &op(EventType::AtenStart, 5)));
    assert!(buffer.push_packed(
        2,
        numbers(Event::Malloc, 0x10),
        &texts(b"N/A", None, b""),
        &[]
    ));
    assert!(buffer.push_op(3, &op(EventType::AtenEnd, 7)));
    let long: &'static [u8] = Box::leak(vec![b'x'; 70_000].into_boxed_slice());
    assert!(!buffer.push_op(
        4,
        &OpRow {
            name: long,
            ..op(EventType::AtenEnd, 8)
        }
    ));
    let out = write_all(&mut backlog, std::slice::from_ref(&buffer));
    let got: Vec<_> = out
        .iter()
        .map(|q| {
            let r = &q.row;
            (
                q.seq,
                r.event,
                r.event_type,
                r.name.as_str(),
                r.ts_ns,
                r.ptr,
                r.device,
            )
        })
        .collect();
    let name = "aten::addmm.default";
    assert_eq!(
        got,
        [
            (
                1,
                Event::OpLaunch,
                EventType::AtenStart,
                name,
                5,
                None,
                DeviceId::None
            ),
            (
                2,
                Event::Malloc,
                EventType::Pta,
                "N/A",
                7,
                Some(0x10),
                DeviceId::Cuda(1)
            ),
            (
                3,
                Event::OpLaunch,
                EventType::AtenEnd,
                name,
                7,
                None,
                DeviceId::None
            ),
        ]
    );
    for q in &out {
        assert_eq!((q.row.pid, q.row.tid), (11, 13));
        assert!(q.row.attrs_json.is_none() && q.row.python_stack.is_empty());
        assert!(q.c_frames.is_empty());
    }
}

/// Rows stay small: each one's bytes are fresh cache lines for the program's thread.
/// The writer keeps the Attr text's string across rows without one: after an op row, a
/// short Attr is written into the long one's string, not into a string of its own.
#[test]
fn rows_without_an_attr_keep_the_attr_string_for_the_next() {
    let buffer = Arc::new(ThreadBuffer::default());
    let mut backlog = Backlog::default();
    let long = format!(r#"{{"site":"{}"}}"#, "x".repeat(200));
    let rows = [
        texts(b"m", Some(long.as_bytes()), b""),
        texts(b"aten::mm.default", None, b""),
        texts(b"m", Some(br#"{"size":1}"#), b""),
    ];
    for (seq, t) in (1..).zip(&rows) {
        assert!(buffer.push_packed(seq, numbers(Event::Malloc, seq), t, &[]));
    }
    backlog.refill_from(std::slice::from_ref(&buffer));
    let mut seen = Vec::new();
    backlog.write_until(u64::MAX, |q| {
        seen.push(q.row.attrs_json.as_ref().map(|a| (a.clone(), a.capacity())));
    });
    let [Some((a, _)), None, Some((c, capacity))] = &seen[..] else {
        panic!("{seen:?}")
    };
    assert_eq!((a, c.as_str()), (&long, r#"{"size":1}"#));
    assert!(*capacity >= long.len(), "capacity {capacity}");
}

#[test]
fn a_packed_row_is_56_bytes() {
    assert_eq!(std::mem::size_of::<Packed>(), 56);
}

/// A row keeps its own sequence number and ids, which its chunk holds once for all its
/// rows: a row that does not share them with the chunk's first starts a chunk of its own.
#[test]
fn sequence_numbers_and_ids_come_back_as_queued() {
    let buffer = Arc::new(ThreadBuffer::default());
    let mut backlog = Backlog::default();
    let row = texts(b"aten::mm.default", None, b"");
    let far = 5 << 32;
    for (seq, tid) in [(3, 13), (4, 13), (far, 13), (far + 1, 14), (far + 2, 13)] {
        let mut n = numbers(Event::OpLaunch, seq);
        n.tid = tid;
        assert!(buffer.push_packed(seq, n, &row, &[]));
    }
    let out = write_all(&mut backlog, std::slice::from_ref(&buffer));
    let got: Vec<(u64, u64, u32)> = out.iter().map(|q| (q.seq, q.row.tid, q.row.pid)).collect();
    assert_eq!(
        got,
        vec![
            (3, 13, 11),
            (4, 13, 11),
            (far, 13, 11),
            (far + 1, 14, 11),
            (far + 2, 13, 11)
        ]
    );
    assert_eq!(buffer.handoff.lock().unwrap().mapped, 4);
}

/// A block row goes as numbers and interned texts; its Attr column is rendered when it is
/// read, packed or (too large for a chunk) whole, the same either way.
#[test]
fn a_block_row_is_rendered_when_read() {
    use msmemscope_core::events::abi::{BlockRecord, BLOCK_OWNER, BLOCK_USED};
    let record = BlockRecord {
        event: Event::Malloc as u32,
        event_type: EventType::Pta as u32,
        device_kind: 1,
        device_index: 0,
        ptr: 0x1000,
        allocation_id: 5,
        size: 256,
        flags: BLOCK_USED | BLOCK_OWNER,
        reserved: 0,
        used: 512,
        total: 0,
        category: StrRef::new("activation"),
        labels: StrRef::EMPTY,
        site: StrRef::new("train.py:7 (step)"),
        frame: StrRef::EMPTY,
        op: StrRef::new("aten::mm"),
        module: StrRef::EMPTY,
        python_stack: StrRef::EMPTY,
    };
    let expected = r#"{"allocation_id":5,"addr":"0x0000000000001000","size":256,"used":512,"owner":"PTA@activation","site":"train.py:7 (step)","op":"aten::mm"}"#;
    let (read, queued, whole) = block_round_trip(&record, Event::Malloc, DeviceId::Cpu);
    assert_eq!(queued, std::mem::size_of::<BlockAttrs>());
    assert_eq!(read.row.attrs_json.as_deref(), Some(expected));
    assert_eq!(read.row.attr_u64("allocation_id"), Some(5));
    assert_eq!(whole.attrs_json.as_deref(), Some(expected));
}

/// A block row of `record` queued alone in a fresh buffer and read back, the arena bytes it
/// took, and the whole row its texts make.
fn block_round_trip(
    record: &msmemscope_core::events::abi::BlockRecord,
    event: Event,
    device: DeviceId,
) -> (Queued, usize, EventRow) {
    let block = Texts {
        name: b"N/A",
        attrs: Attrs::Block(BlockAttrs::of(record)),
        python_stack: b"",
    };
    let buffer = Arc::new(ThreadBuffer::default());
    let mut backlog = Backlog::default();
    assert!(buffer.push_packed(0, numbers(event, record.ptr), &block, &[]));
    let queued = buffer
        .current()
        .map_or(0, |c| c.text_len.load(Ordering::Relaxed));
    let mut out = write_all(&mut backlog, std::slice::from_ref(&buffer));
    let whole = block.row(event, EventType::Pta, device, Some(record.ptr));
    (out.remove(0), queued, whole)
}

/// A block row without the owner member (a FREE row) queues its numbers alone, and reads
/// back as the same Attr as its whole row; its `N/A` name takes no arena byte.
#[test]
fn a_block_row_without_owner_queues_its_numbers_alone() {
    use msmemscope_core::events::abi::{BlockRecord, BLOCK_TOTAL, BLOCK_USED};
    let record = |flags, used, total| BlockRecord {
        event: Event::Free as u32,
        event_type: EventType::Pta as u32,
        device_kind: 2,
        device_index: 1,
        ptr: 0xdead_beef_0000,
        allocation_id: u64::MAX,
        size: 1 << 40,
        flags,
        reserved: 0,
        used,
        total,
        // Not rendered without the owner member, so not queued either.
        category: StrRef::new("activation"),
        labels: StrRef::EMPTY,
        site: StrRef::new("train.py:7 (step)"),
        frame: StrRef::EMPTY,
        op: StrRef::EMPTY,
        module: StrRef::EMPTY,
        python_stack: StrRef::EMPTY,
    };
    let cases = [
        (
            record(BLOCK_USED | BLOCK_TOTAL, 7, 0),
            r#"{"allocation_id":18446744073709551615,"addr":"0x0000deadbeef0000","size":1099511627776,"used":7,"total":0}"#,
        ),
        (
            record(BLOCK_TOTAL, 7, 9),
            r#"{"allocation_id":18446744073709551615,"addr":"0x0000deadbeef0000","size":1099511627776,"total":9}"#,
        ),
        (
            record(0, 7, 9),
            r#"{"allocation_id":18446744073709551615,"addr":"0x0000deadbeef0000","size":1099511627776}"#,
        ),
    ];
    for (record, expected) in cases {
        let (read, queued, whole) = block_round_trip(&record, Event::Free, DeviceId::Cuda(1));
        assert_eq!(queued, std::mem::size_of::<BareBlock>());
        assert_eq!(read.row.name, "N/A");
        assert_eq!(read.row.attrs_json.as_deref(), Some(expected));
        assert_eq!(whole.attrs_json.as_deref(), Some(expected));
    }
}

#[test]
fn full_chunks_are_handed_over_in_order_and_emptied_ones_used_again() {
    let buffer = Arc::new(ThreadBuffer::default());
    let buffers = [buffer.clone()];
    let mut backlog = Backlog::default();
    let mut out = Vec::new();
    let total = CHUNK_ROWS as u64 * 5 + 7;
    for seq in 0..total {
        let name = format!("aten::op{seq}");
        assert!(buffer.push_packed(
            seq,
            numbers(Event::OpLaunch, seq),
            &texts(name.as_bytes(), None, b""),
            &[seq]
        ));
        if seq == CHUNK_ROWS as u64 * 2 + 3 {
            out.extend(write_all(&mut backlog, &buffers));
        }
    }
    out.extend(write_all(&mut backlog, &buffers));
    let seqs: Vec<u64> = out.iter().map(|q| q.seq).collect();
    assert_eq!(seqs, (0..total).collect::<Vec<_>>());
    for q in &out {
        assert_eq!(q.row.name, format!("aten::op{}", q.seq));
        assert_eq!(q.c_frames, vec![q.seq]);
    }
    // The chunks emptied are filled again: one more chunk's rows take one of them.
    let free = || buffer.handoff.lock().unwrap().free.len();
    let kept = free();
    assert!(kept >= 1);
    for seq in total..total + CHUNK_ROWS as u64 {
        let row = texts(b"aten::op", None, b"");
        assert!(buffer.push_packed(seq, numbers(Event::OpLaunch, seq), &row, &[]));
    }
    assert_eq!(free(), kept - 1);
    // A row no chunk can hold is refused (the caller queues it whole).
    let huge = vec![b'x'; CHUNK_TEXT + 1];
    assert!(!buffer.push_packed(
        total,
        numbers(Event::Malloc, 1),
        &texts(b"N/A", None, &huge),
        &[]
    ));
}

/// A thread that fills an uneven number of chunks between drains, while the rows of the
/// last twenty chunks wait for the watermark, maps no new chunk once it has run a while:
/// the writer gives back as many as it held for the thread.
#[test]
fn a_busy_thread_in_a_steady_state_maps_no_new_chunk() {
    let buffer = Arc::new(ThreadBuffer::default());
    let buffers = [buffer.clone()];
    let mut backlog = Backlog::default();
    let lag = 20 * CHUNK_ROWS as u64;
    let mut seq = 0u64;
    let mut written = 0u64;
    let mapped = || buffer.handoff.lock().unwrap().mapped;
    let mut after_warmup = 0;
    for round in 0..120 {
        if round == 40 {
            after_warmup = mapped();
        }
        let chunks = [2u64, 12, 3, 10, 1, 14, 4][round % 7];
        for _ in 0..chunks * CHUNK_ROWS as u64 {
            let mut n = numbers(Event::OpLaunch, seq);
            n.ts_ns = seq;
            assert!(buffer.push_packed(seq, n, &texts(b"aten::mm.default", None, b""), &[]));
            seq += 1;
        }
        backlog.refill_from(&buffers);
        written += backlog.write_until(seq.saturating_sub(lag), |_| {}) as u64;
    }
    // Rows stamped at the watermark are written too.
    assert_eq!(written, seq - lag + 1);
    assert!(
        after_warmup > 20,
        "mapped {after_warmup} chunks to begin with"
    );
    assert_eq!(mapped(), after_warmup);
}

/// Rows younger than the watermark stay where they are, and come first at the next write.
#[test]
fn rows_after_the_watermark_wait_in_their_chunk() {
    let buffer = Arc::new(ThreadBuffer::default());
    let buffers = [buffer.clone()];
    let mut backlog = Backlog::default();
    for seq in 0..10u64 {
        let mut n = numbers(Event::Malloc, seq);
        n.ts_ns = 100 + seq;
        assert!(buffer.push_packed(seq, n, &texts(b"N/A", None, b""), &[]));
    }
    backlog.refill_from(&buffers);
    let mut first = Vec::new();
    assert_eq!(backlog.write_until(104, |q| first.push(q.seq)), 5);
    assert_eq!(first, vec![0, 1, 2, 3, 4]);
    let rest: Vec<u64> = write_all(&mut backlog, &buffers)
        .iter()
        .map(|q| q.seq)
        .collect();
    assert_eq!(rest, vec![5, 6, 7, 8, 9]);
}

/// Two threads' rows come out merged by time, each thread's in its own order; a thread
/// that queued nothing holds nothing up.
#[test]
fn the_rows_of_several_threads_are_merged_by_time() {
    let (a, b) = (
        Arc::new(ThreadBuffer::default()),
        Arc::new(ThreadBuffer::default()),
    );
    let idle = Arc::new(ThreadBuffer::default());
    let mut backlog = Backlog::default();
    for (buffer, times) in [(&a, [1u64, 4, 5, 9]), (&b, [2, 3, 6, 7])] {
        for (seq, ts) in times.into_iter().enumerate() {
            let mut n = numbers(Event::Malloc, ts);
            n.ts_ns = ts;
            assert!(buffer.push_packed(seq as u64, n, &texts(b"N/A", None, b""), &[]));
        }
    }
    assert!(b.push_row(step_row("8", 8, 9)).is_none());
    let times: Vec<u64> = write_all(&mut backlog, &[idle, a, b])
        .iter()
        .map(|q| q.row.ts_ns)
        .collect();
    assert_eq!(times, (1..=9).collect::<Vec<_>>());
}

#[test]
fn a_writer_draining_while_the_thread_queues_gets_every_row_once_in_order() {
    let buffer = Arc::new(ThreadBuffer::default());
    let total: u64 = 200_000;
    let producer = {
        let buffer = buffer.clone();
        std::thread::spawn(move || {
            for seq in 0..total {
                let name = seq.to_string();
                let row = texts(name.as_bytes(), None, b"");
                if seq % 1000 == 999 {
                    assert!(buffer.push_row(step_row(&name, 7, seq)).is_none());
                } else {
                    assert!(buffer.push_packed(seq, numbers(Event::OpLaunch, seq), &row, &[]));
                }
            }
        })
    };
    let buffers = [buffer.clone()];
    let mut backlog = Backlog::default();
    let mut out = Vec::new();
    while !producer.is_finished() {
        out.extend(write_all(&mut backlog, &buffers));
    }
    producer.join().unwrap();
    out.extend(write_all(&mut backlog, &buffers));
    let mut seqs: Vec<u64> = out.iter().map(|q| q.seq).collect();
    // Packed rows arrive in the order queued; whole rows may come a drain early.
    let packed: Vec<u64> = seqs.iter().copied().filter(|s| s % 1000 != 999).collect();
    assert!(packed.windows(2).all(|w| w[0] < w[1]));
    seqs.sort_unstable();
    assert_eq!(seqs, (0..total).collect::<Vec<_>>());
    assert!(out.iter().all(|q| q.row.name == q.seq.to_string()));
}
