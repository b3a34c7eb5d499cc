//! Typed identifiers and tokens: the values that travel side by side through the ports.
//!
//! Each is a newtype over `String`, serialized transparently (a document, a filter, a
//! Redis key or a printed line holds exactly the string it held before), so two of them
//! cannot trade places in a call: `revert_leased(object_id, fencing_token, lease_token,
//! at)` does not compile with its tokens swapped. Each reads as a `&str` (`Deref`), so
//! code that only reads the string keeps working; the reverse needs a conversion
//! (`"wf-1".into()`, `WorkflowId::from(s)`). They carry no validation of their own:
//! the K-2.0 identifier rule is applied where a value crosses a port
//! ([`validate::identifier`](crate::validate::identifier) and the `validate()` functions).
//!
//! ```
//! use kernel_core::id::{FencingToken, LeaseToken, WorkflowId};
//! let wf = WorkflowId::from("wf-1");
//! assert_eq!(wf, "wf-1");
//! assert_eq!(wf.to_string(), "wf-1");
//! assert_eq!(serde_json::to_string(&wf).unwrap(), "\"wf-1\"");
//! fn revert(_fencing: &FencingToken, _lease: &LeaseToken) {}
//! revert(&"f1".into(), &"lease-1".into());
//! ```
//!
//! A call with two tokens swapped is refused by the compiler:
//!
//! ```compile_fail
//! use kernel_core::ports::DynOutbox;
//! use kernel_core::{FencingToken, Instant, LeaseToken, ObjectId};
//! async fn give_back(o: &DynOutbox, id: &ObjectId, f: &FencingToken, d: &LeaseToken) {
//!     let _ = o.revert_leased(id, d, f, Instant::ZERO).await; // lease and round swapped
//! }
//! ```
//!
//! ```
//! use kernel_core::ports::DynOutbox;
//! use kernel_core::{FencingToken, Instant, LeaseToken, ObjectId};
//! async fn give_back(o: &DynOutbox, id: &ObjectId, f: &FencingToken, d: &LeaseToken) {
//!     let _ = o.revert_leased(id, f, d, Instant::ZERO).await;
//! }
//! ```
//!
//! [`BusinessRound`] reads the business round a workflow's input carries, in one place.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::borrow::Borrow;
use std::fmt;

macro_rules! string_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            /// Wrap a string (no validation: the K-2.0 rule applies at the port boundary).
            pub fn new(s: impl Into<String>) -> Self {
                $name(s.into())
            }
            /// The string form, as stored and printed.
            pub fn as_str(&self) -> &str {
                &self.0
            }
            /// The owned string form.
            pub fn into_string(self) -> String {
                self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        // Reading one as a `&str` (a filter value, a key, `Option::as_deref`) is always
        // safe; only the reverse, a bare string where a typed value is expected, is refused.
        impl std::ops::Deref for $name {
            type Target = str;
            fn deref(&self) -> &str {
                &self.0
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        impl From<String> for $name {
            fn from(s: String) -> Self {
                $name(s)
            }
        }

        impl From<&str> for $name {
            fn from(s: &str) -> Self {
                $name(s.to_string())
            }
        }

        impl From<&String> for $name {
            fn from(s: &String) -> Self {
                $name(s.clone())
            }
        }

        impl From<&$name> for $name {
            fn from(s: &$name) -> Self {
                s.clone()
            }
        }

        impl From<$name> for String {
            fn from(s: $name) -> String {
                s.0
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }

        impl PartialEq<String> for $name {
            fn eq(&self, other: &String) -> bool {
                &self.0 == other
            }
        }

        impl PartialEq<$name> for str {
            fn eq(&self, other: &$name) -> bool {
                self == other.0
            }
        }

        impl PartialEq<$name> for &str {
            fn eq(&self, other: &$name) -> bool {
                *self == other.0
            }
        }

        impl PartialEq<$name> for String {
            fn eq(&self, other: &$name) -> bool {
                *self == other.0
            }
        }
    };
}

string_id! {
    /// The business-facing id of a workflow instance (`workflow_id`, K-2): the address of
    /// every store write, queue member and signal target.
    WorkflowId
}

string_id! {
    /// The token of one claim (`claim_token`, K-6.2): every write of the claim holder is
    /// fenced by it, so a zombie's writes miss (K-6.4).
    ClaimToken
}

impl ClaimToken {
    /// The last six characters: enough to tell claims apart in a log line, a span or an
    /// operator's view, without handing out the token that fences writes.
    ///
    /// ```
    /// use kernel_core::ClaimToken;
    /// assert_eq!(ClaimToken::from("c-0123456789abcdef").suffix(), "abcdef");
    /// assert_eq!(ClaimToken::from("ab").suffix(), "ab");
    /// assert_eq!(ClaimToken::from("xäöüßéè").suffix(), "äöüßéè");
    /// ```
    pub fn suffix(&self) -> &str {
        let t = self.as_str();
        match t.char_indices().rev().nth(5) {
            Some((i, _)) => &t[i..],
            None => t,
        }
    }
}

string_id! {
    /// The business round (`fencing_token`, K-12): every conditional write of a dispatch
    /// intent and every fenced business write compares it.
    FencingToken
}

string_id! {
    /// A business object's id in the dispatch outbox (its primary key in the business
    /// collection, K-11).
    ObjectId
}

string_id! {
    /// The token of one recovery dispatcher's per-object lease (`lease_token`, K-11.3): a
    /// late lease holder's writes miss.
    LeaseToken
}

/// The business round a workflow's input carries (K-12): the business object it works on
/// (`input.object_id`) and the round's fencing token (`input.fencing_token`).
///
/// The one place that reads them from an input, so the engine (stream keys), activities
/// ([`ActivityContext::fencing_token`](crate::ActivityContext::fencing_token)) and the
/// dispatch paths (the snapshot must carry the intent's round) agree on where they live.
///
/// ```
/// use kernel_core::id::{BusinessRound, FencingToken};
/// let input = serde_json::json!({"object_id": "doc-1", "fencing_token": "f1", "x": 1});
/// let round = BusinessRound::of(&input);
/// assert_eq!(round.object_id.as_ref().unwrap(), "doc-1");
/// assert!(round.is(&FencingToken::from("f1")));
/// assert_eq!(BusinessRound::of(&serde_json::json!({"fencing_token": 7})), BusinessRound::default());
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct BusinessRound {
    /// `input.object_id` when it is a string; `None` for workflows not tied to an object.
    pub object_id: Option<ObjectId>,
    /// `input.fencing_token` when it is a string; `None` for workflows outside a round.
    pub fencing_token: Option<FencingToken>,
}

impl BusinessRound {
    /// The input field that names the business object.
    pub const OBJECT_ID_FIELD: &'static str = "object_id";
    /// The input field that holds the round's fencing token.
    pub const FENCING_TOKEN_FIELD: &'static str = "fencing_token";

    /// Read the round from a workflow's input; a missing or non-string field is `None`.
    pub fn of(input: &Value) -> Self {
        let field = |name: &str| input.get(name).and_then(Value::as_str);
        BusinessRound {
            object_id: field(Self::OBJECT_ID_FIELD).map(ObjectId::from),
            fencing_token: field(Self::FENCING_TOKEN_FIELD).map(FencingToken::from),
        }
    }

    /// Whether the input's round is exactly `token` (an input without one is not).
    pub fn is(&self, token: &FencingToken) -> bool {
        self.fencing_token.as_ref() == Some(token)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::collections::BTreeMap;

    #[test]
    fn newtypes_serialize_as_the_bare_string() {
        let wf = WorkflowId::from("wf-1");
        assert_eq!(serde_json::to_value(&wf).unwrap(), json!("wf-1"));
        assert_eq!(serde_json::from_value::<WorkflowId>(json!("wf-1")).unwrap(), wf);
        let lease: Option<LeaseToken> = serde_json::from_value(json!("d-1")).unwrap();
        assert_eq!(serde_json::to_string(&lease).unwrap(), "\"d-1\"");
        assert_eq!(format!("{}|{:?}", ClaimToken::from("t"), ObjectId::from("o")), "t|ObjectId(\"o\")");
    }

    #[test]
    fn newtypes_compare_and_look_up_as_strings() {
        let f = FencingToken::from("f1".to_string());
        let (lit, owned) = ("f1", String::from("f1"));
        assert_eq!(f, lit);
        assert_eq!(lit, f);
        assert_eq!(f, *lit);
        assert_eq!(f, owned);
        assert_eq!(owned, f);
        assert_ne!(f, "f2");
        let mut m = BTreeMap::new();
        m.insert(WorkflowId::from("wf-1"), 1);
        assert_eq!(m.get("wf-1"), Some(&1));
        let (a, b) = (ObjectId::from("a"), ObjectId::from("b"));
        assert!(a < b);
    }

    #[test]
    fn business_round_reads_both_fields_once() {
        let r = BusinessRound::of(&json!({"object_id": "doc-1", "fencing_token": "f1"}));
        assert_eq!(r.object_id, Some(ObjectId::from("doc-1")));
        assert_eq!(r.fencing_token, Some(FencingToken::from("f1")));
        assert!(r.is(&"f1".into()));
        assert!(!r.is(&"f2".into()));
        let none = BusinessRound::of(&json!({"object_id": 1, "fencing_token": null}));
        assert_eq!(none, BusinessRound::default());
        assert!(!none.is(&"f1".into()));
        assert_eq!(BusinessRound::of(&json!("not an object")), BusinessRound::default());
    }
}
