//! Codec: round trip of every frame type, random bytes give only typed errors, and the
//! SSE envelope defaults pinned by a snapshot (K-16).

use proptest::prelude::*;
use serde_json::{json, Value};
use sse_stream::codec::{decode, encode, header, CodecError, Record, RecordType, VERSION};
use sse_stream::event::{SseEvent, DEFAULTS};

fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        // Dyadic fractions: exact in decimal, so the comparison is about the codec, not float parsing.
        (-1_000_000i64..1_000_000).prop_map(|n| json!(n as f64 / 8.0)),
        ".{0,24}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(".{0,8}", inner, 0..6).prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn arb_record() -> impl Strategy<Value = Record> {
    prop_oneof![
        ".{0,200}".prop_map(Record::Text),
        arb_json().prop_map(Record::Control),
        arb_json().prop_map(Record::Error),
        arb_json().prop_map(Record::Terminal),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn every_frame_type_round_trips(record in arb_record()) {
        let bytes = encode(&record).expect("encode");
        prop_assert_eq!(bytes[0], (VERSION << 4) | record.record_type() as u8);
        let back = decode(&bytes).expect("decode");
        prop_assert_eq!(&back, &record);
        // Compact record -> full SSE event -> JSON -> event -> compact record.
        let event = SseEvent::from_record(back);
        let parsed: SseEvent = serde_json::from_str(&event.to_json()).expect("event JSON");
        prop_assert_eq!(&parsed, &event);
        prop_assert_eq!(parsed.to_record(), Some(record));
    }

    #[test]
    fn random_bytes_give_only_typed_errors(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        // Never a panic; either a record that re-encodes to the same bytes or a typed error.
        match decode(&bytes) {
            Ok(r) => {
                let t = r.record_type();
                prop_assert_eq!(bytes[0], header(t));
                if t == RecordType::Text {
                    prop_assert_eq!(encode(&r).expect("encode"), bytes);
                }
            }
            Err(e) => {
                let typed = matches!(
                    e,
                    CodecError::Empty
                        | CodecError::UnknownVersion(_)
                        | CodecError::UnknownType { .. }
                        | CodecError::InvalidUtf8
                        | CodecError::InvalidJson(_)
                        | CodecError::TooLarge(_)
                );
                prop_assert!(typed, "untyped error {:?}", e);
            }
        }
    }

    #[test]
    fn headers_with_a_valid_version_and_type_and_garbage_json_are_typed(
        t in prop::sample::select(vec![2u8, 3, 5]),
        tail in prop::collection::vec(any::<u8>(), 0..64),
    ) {
        let mut bytes = vec![(VERSION << 4) | t];
        bytes.extend(tail);
        match decode(&bytes) {
            Ok(_) | Err(CodecError::InvalidJson(_)) => {}
            Err(e) => prop_assert!(false, "unexpected error {e:?}"),
        }
    }
}

#[test]
fn unknown_versions_and_types_are_rejected() {
    assert_eq!(decode(&[]), Err(CodecError::Empty));
    assert_eq!(decode(&[0x21, b'x']), Err(CodecError::UnknownVersion(2)));
    assert_eq!(decode(&[0x01, b'x']), Err(CodecError::UnknownVersion(0)));
    for t in [0u8, 4, 6, 15] {
        assert_eq!(decode(&[0x10 | t]), Err(CodecError::UnknownType { version: 1, kind: t }));
    }
    assert_eq!(decode(&[0x11, 0xff, 0xfe]), Err(CodecError::InvalidUtf8));
    assert!(matches!(decode(&[0x12, b'{']), Err(CodecError::InvalidJson(_))));
}

#[test]
fn header_bytes_are_version_and_type() {
    assert_eq!(header(RecordType::Text), 0x11);
    assert_eq!(header(RecordType::Control), 0x12);
    assert_eq!(header(RecordType::Error), 0x13);
    assert_eq!(header(RecordType::Terminal), 0x15);
    assert_eq!(encode(&Record::Control(json!({"a": 1}))).unwrap(), b"\x12{\"a\":1}");
}

/// The envelope defaults and one restored event of each type, as a client sees them.
/// A change here is a protocol change: update `tests/snapshots/sse_defaults.json` only on
/// purpose.
#[test]
fn sse_event_defaults_snapshot() {
    let events: Vec<SseEvent> = vec![
        Record::Text("hello".into()),
        Record::Control(json!({"phase": "compose"})),
        Record::Error(json!({"message": "model timeout"})),
        Record::Error(json!({"code": 429, "message": "rate limited"})),
        Record::Terminal(json!({"status": "completed", "revision": 9})),
    ]
    .into_iter()
    .map(|r| SseEvent::from_record(decode(&encode(&r).unwrap()).unwrap()))
    .collect();
    let actual = json!({ "defaults": DEFAULTS, "events": events });
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/snapshots/sse_defaults.json");
    if std::env::var("UPDATE_SNAPSHOTS").is_ok_and(|v| v == "1") {
        std::fs::write(path, serde_json::to_string_pretty(&actual).unwrap() + "\n").unwrap();
    }
    let expected = std::fs::read_to_string(path).expect("snapshot file (UPDATE_SNAPSHOTS=1 writes it)");
    // Compared as JSON values: key order depends on serde_json features, not on the protocol.
    let expected: serde_json::Value = serde_json::from_str(&expected).expect("snapshot JSON");
    assert_eq!(actual, expected, "SSE defaults changed; rerun with UPDATE_SNAPSHOTS=1 if intended");
    // The wire text of one event is fixed by the struct's field order.
    assert_eq!(events[0].to_json(), r#"{"code":0,"retry":1000,"msg_type":"text","data":"hello"}"#);
}
