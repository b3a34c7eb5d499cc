//! Stream keys and read grants (K-16): a stream's Redis keys cannot be derived from its
//! public identity (object id, workflow id, round token) without the server's secret.

use kernel_core::ports::StreamKey;
use kernel_core::Error;
use sha2::{Digest, Sha256};
use sse_stream::{ReadGrants, StreamAuthorizer, StreamKeys, StreamSecret};

fn secret(b: u8) -> StreamSecret {
    StreamSecret::new([b; 32]).expect("32 bytes")
}

fn key() -> StreamKey {
    StreamKey { object_id: "doc-42".into(), workflow_id: "wf-7".into(), fencing_token: "f1".into() }
}

/// The digest anyone can compute from the identity alone (the old key derivation).
fn unkeyed_digest(k: &StreamKey) -> String {
    let mut h = Sha256::new();
    for part in [k.object_id.as_str(), k.workflow_id.as_str(), k.fencing_token.as_str()] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part.as_bytes());
    }
    hex::encode(&h.finalize()[..16])
}

/// Defect 14: keys are keyed by the server's secret, and keep one hash tag per stream.
#[test]
fn stream_keys_cannot_be_guessed_from_the_identity() {
    let keys = StreamKeys::new("wfk", &secret(1), &key());
    let guess = format!("wfk:sse:{{{}}}:frames", unkeyed_digest(&key()));
    assert_ne!(keys.frames, guess, "the frame list's key follows from public identifiers alone");
    // Another secret, other keys; the same secret, the same keys (writers and readers agree).
    assert_ne!(StreamKeys::new("wfk", &secret(2), &key()), keys);
    assert_eq!(StreamKeys::new("wfk", &secret(1), &key()), keys);
    // One hash tag for the four keys: one cluster slot, so one script can touch them all.
    let tag = |k: &str| k[k.find('{').unwrap()..=k.find('}').unwrap()].to_string();
    let all = [&keys.frames, &keys.generation, &keys.terminal, &keys.owner];
    assert!(all.iter().all(|k| tag(k) == tag(&keys.frames)), "{keys:?}");
    assert_eq!(tag(&keys.frames).len(), 2 + 32, "a 128-bit tag");
    // Identities that concatenate alike still differ (length-prefixed parts).
    let shifted = StreamKey { object_id: "doc-4".into(), workflow_id: "2wf-7".into(), fencing_token: "f1".into() };
    assert_ne!(StreamKeys::new("wfk", &secret(1), &shifted), keys);
    assert!(format!("{:?}", secret(1)).contains("32 bytes") && !format!("{:?}", secret(1)).contains("1, 1"));
    assert!(matches!(StreamSecret::new([1u8; 31]), Err(Error::InvalidInput { .. })));
}

/// Defect 14: the stream endpoint's authorisation hook. A grant opens exactly one stream;
/// no grant, a forged one, another stream's or another secret's is refused.
#[test]
fn the_stream_endpoint_refuses_readers_without_a_grant() {
    let grants = ReadGrants::new(secret(1));
    let grant = grants.grant(&key());
    assert!(grants.authorize(&key(), Some(&grant)).is_ok());
    let refused = |credential: Option<&str>, k: &StreamKey| matches!(grants.authorize(k, credential), Err(Error::InvalidInput { field, .. }) if field == "credential");
    assert!(refused(None, &key()));
    assert!(refused(Some(""), &key()));
    assert!(refused(Some("not hex"), &key()));
    assert!(refused(Some(&grant[..grant.len() - 2]), &key()), "a truncated grant");
    assert!(refused(Some(&unkeyed_digest(&key())), &key()), "a digest of the identity is no grant");
    let next_round = StreamKey { fencing_token: "f2".into(), ..key() };
    assert!(refused(Some(&grant), &next_round), "a grant opens one round's stream only");
    let other = ReadGrants::new(secret(2));
    assert!(refused(Some(&other.grant(&key())), &key()), "another secret's grant");
}
