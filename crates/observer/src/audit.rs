//! The operator audit log: one [`AuditEntry`] per operator action (who, in which role, did
//! what to which target, and what came of it), kept beside the projection so an operator
//! console can answer "who did this" without reading `workflow_instances`.
//!
//! Every repository checks an entry with [`AuditEntry::validate`] and a query with
//! [`AuditQuery::validate`] before it touches storage, so all of them refuse the same
//! inputs; [`AuditQuery::matches`] and [`AuditQuery::order`] are the reference semantics of
//! `find_audit`.

use crate::projection::{after_cursor, input, reason_of};
use crate::{Error, Result};
use kernel_core::domain::Instant;
use serde::{Deserialize, Serialize};
use std::cmp::Ordering;

/// Longest `actor`, `target` and `id`, in bytes (the identifier rule of K-2.0).
pub const AUDIT_NAME_BYTES_MAX: usize = kernel_core::validate::IDENTIFIER_BYTES_MAX;
/// Longest `role` and `action`, in bytes.
pub const AUDIT_VERB_BYTES_MAX: usize = 64;
/// Largest `detail`, as serialized JSON bytes: 16 KiB.
pub const AUDIT_DETAIL_BYTES_MAX: usize = 16 * 1024;
/// Longest `reason`, in bytes.
pub const AUDIT_REASON_BYTES_MAX: usize = 1_024;
/// Most entries one [`purge_audit`](crate::ObservationRepository::purge_audit) call deletes.
pub const AUDIT_PURGE_MAX: usize = 1_000;

/// What came of an operator action.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AuditResult {
    /// Done.
    Ok,
    /// The target does not exist.
    NotFound,
    /// The request was malformed or broke a limit.
    BadInput,
    /// Not allowed (role, state, or a conditional write lost).
    Refused,
    /// A backend could not be reached; the outcome may be unknown.
    Unavailable,
}

impl AuditResult {
    /// The snake_case name used in documents and columns.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::NotFound => "not_found",
            Self::BadInput => "bad_input",
            Self::Refused => "refused",
            Self::Unavailable => "unavailable",
        }
    }
}

/// One operator action, appended once per `id`.
///
/// ```
/// use kernel_core::domain::Instant;
/// use observer::{AuditEntry, AuditResult};
/// let e = AuditEntry {
///     id: "op-1".into(),
///     at: Instant::from_millis(1_700_000_000_000),
///     actor: "alice@example.com".into(),
///     role: "operator".into(),
///     action: "workflow.cancel".into(),
///     target: "wf-42".into(),
///     detail: serde_json::json!({"why": "duplicate order"}),
///     result: AuditResult::Refused,
///     reason: Some("already completed".into()),
/// };
/// assert!(e.validate().is_ok());
/// assert_eq!(serde_json::to_value(&e).unwrap()["result"], "refused");
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditEntry {
    /// The caller's id of the action (identifier rule): appending it again changes nothing.
    pub id: String,
    /// When the action was taken (the caller's clock).
    pub at: Instant,
    /// Who acted (identifier rule).
    pub actor: String,
    /// In which role (1–[`AUDIT_VERB_BYTES_MAX`] bytes, identifier rule).
    pub role: String,
    /// What was done, e.g. `workflow.cancel` (1–[`AUDIT_VERB_BYTES_MAX`] bytes, identifier
    /// rule).
    pub action: String,
    /// What it was done to: a workflow id, a biz key, a task id (identifier rule).
    pub target: String,
    /// The action's parameters: a value every store can hold (K-2.0), at most
    /// [`AUDIT_DETAIL_BYTES_MAX`] serialized bytes; `null` when there are none.
    #[serde(default)]
    pub detail: serde_json::Value,
    /// What came of it.
    pub result: AuditResult,
    /// Why, when the result needs explaining: at most [`AUDIT_REASON_BYTES_MAX`] bytes,
    /// no NUL.
    #[serde(default)]
    pub reason: Option<String>,
}

impl AuditEntry {
    /// The check every repository makes before it appends: [`Error::InvalidRecord`] naming
    /// the field, nothing written.
    pub fn validate(&self) -> Result<()> {
        let invalid = |field: &str, reason: String| Error::InvalidRecord(format!("audit {field}: {reason}"));
        let id = |field: &str, value: &str, max: usize| {
            kernel_core::validate::identifier(field, value).map_err(|e| invalid(field, reason_of(e)))?;
            if value.len() > max {
                return Err(invalid(field, format!("{} bytes exceeds the limit of {max}", value.len())));
            }
            Ok(())
        };
        id("id", &self.id, AUDIT_NAME_BYTES_MAX)?;
        id("actor", &self.actor, AUDIT_NAME_BYTES_MAX)?;
        id("role", &self.role, AUDIT_VERB_BYTES_MAX)?;
        id("action", &self.action, AUDIT_VERB_BYTES_MAX)?;
        id("target", &self.target, AUDIT_NAME_BYTES_MAX)?;
        kernel_core::validate::payload("detail", &self.detail, AUDIT_DETAIL_BYTES_MAX)
            .map_err(|e| invalid("detail", reason_of(e)))?;
        if let Some(r) = &self.reason {
            if r.len() > AUDIT_REASON_BYTES_MAX {
                return Err(invalid(
                    "reason",
                    format!("{} bytes exceeds the limit of {AUDIT_REASON_BYTES_MAX}", r.len()),
                ));
            }
            if r.contains('\0') {
                return Err(invalid("reason", "contains NUL, which not every store can hold".into()));
            }
        }
        Ok(())
    }
}

/// Audit entries for an operator console; every filter is optional. Newest `at` first,
/// ties by `id` ascending ([`AuditQuery::order`]); page with [`before`](Self::before).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AuditQuery {
    /// Exactly this actor.
    pub actor: Option<String>,
    /// Exactly this action.
    pub action: Option<String>,
    /// Exactly this target.
    pub target: Option<String>,
    /// Keyset paging: `(at, id)` of the last entry of the previous page; only entries
    /// strictly after it in the newest-first order are returned.
    pub before: Option<(Instant, String)>,
    /// Most entries (capped at [`QUERY_LIMIT_MAX`](crate::projection::QUERY_LIMIT_MAX); 0 means
    /// the cap).
    pub limit: usize,
}

impl AuditQuery {
    /// The check every repository makes before it queries: each filter and the cursor's
    /// id follow the identifier rule (K-2.0), else [`Error::InvalidInput`].
    pub fn validate(&self) -> Result<()> {
        input("actor", self.actor.as_deref())?;
        input("action", self.action.as_deref())?;
        input("target", self.target.as_deref())?;
        input("before", self.before.as_ref().map(|(_, id)| id.as_str()))
    }

    /// Whether an entry matches (reference semantics for every repository), the cursor
    /// included.
    pub fn matches(&self, e: &AuditEntry) -> bool {
        self.actor.as_ref().is_none_or(|a| *a == e.actor)
            && self.action.as_ref().is_none_or(|a| *a == e.action)
            && self.target.as_ref().is_none_or(|t| *t == e.target)
            && self.before.as_ref().is_none_or(|(at, id)| after_cursor((e.at, &e.id), (*at, id)))
    }

    /// The order of results: newest `at` first, ties by `id` ascending.
    pub fn order(a: &AuditEntry, b: &AuditEntry) -> Ordering {
        b.at.cmp(&a.at).then_with(|| a.id.cmp(&b.id))
    }
}

/// The check of a [`purge_audit`](crate::ObservationRepository::purge_audit) limit:
/// `1..=`[`AUDIT_PURGE_MAX`], else [`Error::InvalidInput`].
pub fn check_audit_purge_limit(limit: usize) -> Result<()> {
    kernel_core::validate::limit_in("limit", limit, AUDIT_PURGE_MAX)
        .map_err(|e| Error::InvalidInput { field: "limit".into(), reason: reason_of(e) })
}
