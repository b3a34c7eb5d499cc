//! Model steps (K-17.3, K-17.4): the [`Model`] trait a user implements for their provider,
//! the request an activity sends through [`ActivityContext::model`], and the versioned
//! [`OutputSchema`] its answers are validated against.
//!
//! A call made through the context is recorded with the step before the activity
//! continues — input hash, prompt and model versions, parameters, every sample (raw,
//! parsed, validation errors, usage and cost) — and read back, never re-sampled, by every
//! later invocation of the same logical attempt (K-17.1).
//!
//! ```
//! use kernel_core::model_call::{Model, ModelAnswer, ModelRequest, OutputSchema};
//! use kernel_core::record::{Usage, VersionRef};
//! use kernel_core::{ActivityContext, ActivityError, StepOutcome};
//! use serde_json::json;
//!
//! struct Provider;
//! #[async_trait::async_trait]
//! impl Model for Provider {
//!     fn version(&self) -> VersionRef {
//!         VersionRef::new("summarizer", "2026-11")
//!     }
//!     async fn generate(&self, req: &ModelRequest, _ctx: &ActivityContext) -> Result<ModelAnswer, ActivityError> {
//!         // Call the provider here; classify its errors (rate limit → transient).
//!         Ok(ModelAnswer { raw: format!("{{\"summary\": \"{} words\"}}", req.input["words"]), usage: Usage::default() })
//!     }
//! }
//!
//! let schema = OutputSchema::new(
//!     VersionRef::new("summary", "1"),
//!     json!({"type": "object", "required": ["summary"], "properties": {"summary": {"type": "string"}}}),
//! )
//! .unwrap();
//! // Inside an activity of a step declared with `.output_schema(schema)`:
//! async fn compose(ctx: ActivityContext) -> Result<StepOutcome, ActivityError> {
//!     let request = ModelRequest::new("compose", VersionRef::new("summary-prompt", "4"), json!({"words": 120}));
//!     let output = ctx.model(&Provider, request).await?;
//!     Ok(StepOutcome::complete(output))
//! }
//! # let _ = (schema, compose);
//! ```

use crate::activity::{ActivityContext, ActivityError};
use crate::error::{Error, Result};
use crate::record::{Usage, VersionRef};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Default number of re-samples of an invalid answer within one logical attempt (K-17.4).
pub const RESAMPLES_DEFAULT: u32 = 2;

/// A language model (or any probabilistic provider), implemented by the user.
#[async_trait::async_trait]
pub trait Model: Send + Sync + 'static {
    /// The model's id and version, recorded with every call.
    fn version(&self) -> VersionRef;

    /// Generate one answer. Classify failures: a rate limit, timeout or unavailable
    /// provider is [`ActivityError::transient`] (the step retries with backoff and the
    /// record is read back, so recorded samples are not drawn again); a refused request is
    /// permanent. Stream tokens to `ctx.stream()` while generating, if the step streams
    /// (K-16); only the final answer is recorded. Observe `ctx.cancellation()`.
    async fn generate(&self, request: &ModelRequest, ctx: &ActivityContext) -> Result<ModelAnswer, ActivityError>;
}

/// What a model produced: raw text and what it cost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelAnswer {
    /// The raw output; parsed as JSON when the call has a schema.
    pub raw: String,
    /// Tokens and cost.
    pub usage: Usage,
}

/// One model call of a step.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelRequest {
    /// The call's label within the step (a K-2.0 identifier): calls are matched to their
    /// records by order and label.
    pub label: String,
    /// Prompt template id and version.
    pub prompt: VersionRef,
    /// What the prompt is rendered with.
    pub input: Value,
    /// Sampling parameters (temperature, …).
    pub params: Value,
    /// Re-samples allowed after an invalid answer; `None`: the step's setting.
    pub resamples: Option<u32>,
    /// Tool and data versions of a read-only call that may be served from the result
    /// cache (K-17.7); `None`: never cached.
    pub cache: Option<CacheUse>,
    /// Call key of the sample being drawn (`idempotency key ∥ label ∥ sample`), set by
    /// the kernel before each `generate`: stable across crashes of one logical attempt,
    /// so a provider that dedupes by key never bills a retried sample twice.
    pub sample_key: String,
    /// The schema this call's answers are validated against instead of the step's
    /// [`output_schema`](crate::StepDef::output_schema) (an agent's proposals, say);
    /// `None`: the step's. The schema's version is recorded with the call, and a recorded
    /// output is migrated by this schema's migrations.
    pub schema: Option<OutputSchema>,
}

/// What makes a cached answer valid besides the prompt and model versions (K-17.7).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheUse {
    /// Version of the tools the call relies on.
    pub tool_version: String,
    /// Version of the data the call reads.
    pub data_version: String,
    /// How long a cached answer stays valid.
    pub ttl: crate::domain::DurationMs,
}

impl ModelRequest {
    /// A call labelled `label` of prompt `prompt` rendered with `input`; no parameters.
    pub fn new(label: impl Into<String>, prompt: VersionRef, input: Value) -> Self {
        ModelRequest {
            label: label.into(),
            prompt,
            input,
            params: Value::Null,
            resamples: None,
            cache: None,
            sample_key: String::new(),
            schema: None,
        }
    }
    /// Validate this call's answers against `schema` instead of the step's output schema,
    /// re-sampling an invalid answer within the same bound; the step's own schema (which
    /// its output is held to) is untouched.
    pub fn output_schema(mut self, schema: OutputSchema) -> Self {
        self.schema = Some(schema);
        self
    }
    /// Sampling parameters.
    pub fn params(mut self, params: Value) -> Self {
        self.params = params;
        self
    }
    /// Re-samples allowed after an invalid answer (default: the step's, itself default 2).
    pub fn resamples(mut self, n: u32) -> Self {
        self.resamples = Some(n);
        self
    }
    /// Serve from the result cache when an answer for the same content is there (only in
    /// a step declared read-only, with a cache configured).
    pub fn cached(
        mut self,
        tool_version: impl Into<String>,
        data_version: impl Into<String>,
        ttl: impl Into<crate::domain::DurationMs>,
    ) -> Self {
        self.cache =
            Some(CacheUse { tool_version: tool_version.into(), data_version: data_version.into(), ttl: ttl.into() });
        self
    }

    /// Hex SHA-256 of what the call asks (prompt id/version, parameters, input),
    /// length-prefixed so no two requests encode alike. The model is not part of it: a
    /// call recorded under one model version is read back after a model upgrade (K-17.3);
    /// its model version stays in the record.
    pub fn input_hash(&self) -> String {
        let mut h = Sha256::new();
        for part in [
            self.prompt.id.as_bytes(),
            self.prompt.version.as_bytes(),
            canonical_json(&self.params).as_bytes(),
            canonical_json(&self.input).as_bytes(),
        ] {
            h.update((part.len() as u64).to_be_bytes());
            h.update(part);
        }
        hex(&h.finalize())
    }
}

/// JSON with object keys sorted at every level and no whitespace.
pub fn canonical_json(v: &Value) -> String {
    fn write(v: &Value, out: &mut String) {
        match v {
            Value::Object(m) => {
                let sorted: BTreeMap<&String, &Value> = m.iter().collect();
                out.push('{');
                for (i, (k, v)) in sorted.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&Value::String(k.clone()).to_string());
                    out.push(':');
                    write(v, out);
                }
                out.push('}');
            }
            Value::Array(a) => {
                out.push('[');
                for (i, v) in a.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write(v, out);
                }
                out.push(']');
            }
            other => out.push_str(&other.to_string()),
        }
    }
    let mut out = String::new();
    write(v, &mut out);
    out
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Migrates an output recorded under an older schema version to the current one.
pub type Migration = Arc<dyn Fn(Value) -> std::result::Result<Value, String> + Send + Sync>;

/// A versioned JSON Schema for a model step's output (K-17.4), compiled once.
///
/// Two schemas are equal when their versions and JSON Schema documents are (registered
/// migrations are functions and are not compared).
#[derive(Clone)]
pub struct OutputSchema {
    version: VersionRef,
    schema: Arc<Value>,
    validator: Arc<jsonschema::Validator>,
    migrations: BTreeMap<String, Migration>,
}

impl PartialEq for OutputSchema {
    fn eq(&self, other: &Self) -> bool {
        self.version == other.version && self.schema == other.schema
    }
}

impl std::fmt::Debug for OutputSchema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutputSchema")
            .field("version", &self.version)
            .field("migrations_from", &self.migrations.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl OutputSchema {
    /// Compile `schema` (JSON Schema) as `version`. A schema that does not compile, or an
    /// id or version that is not a K-2.0 identifier, is [`Error::InvalidInput`].
    ///
    /// ```
    /// use kernel_core::model_call::OutputSchema;
    /// use kernel_core::record::VersionRef;
    /// let bad = OutputSchema::new(VersionRef::new("invoice", "1"), serde_json::json!({"type": 12}));
    /// assert!(matches!(bad, Err(kernel_core::Error::InvalidInput { .. })));
    /// ```
    pub fn new(version: VersionRef, schema: Value) -> Result<Self> {
        crate::validate::identifier("schema.id", &version.id)?;
        crate::validate::identifier("schema.version", &version.version)?;
        let validator = jsonschema::validator_for(&schema)
            .map_err(|e| Error::invalid("schema", format_args!("{version} does not compile: {e}")))?;
        Ok(OutputSchema {
            version,
            schema: Arc::new(schema),
            validator: Arc::new(validator),
            migrations: BTreeMap::new(),
        })
    }

    /// Register how an output recorded under `from_version` becomes one of this version.
    pub fn migration(
        mut self,
        from_version: impl Into<String>,
        f: impl Fn(Value) -> std::result::Result<Value, String> + Send + Sync + 'static,
    ) -> Self {
        self.migrations.insert(from_version.into(), Arc::new(f));
        self
    }

    /// The schema's id and version.
    pub fn version(&self) -> &VersionRef {
        &self.version
    }

    /// Validation errors of `output` (empty: valid), at most 8, each at most 512 bytes.
    pub fn errors(&self, output: &Value) -> Vec<String> {
        self.validator
            .iter_errors(output)
            .take(8)
            .map(|e| {
                let mut s = format!("{}: {e}", e.instance_path());
                if s.len() > 512 {
                    let mut cut = 512;
                    while !s.is_char_boundary(cut) {
                        cut -= 1;
                    }
                    s.truncate(cut);
                }
                s
            })
            .collect()
    }

    /// The migration from `from_version`, if registered.
    pub fn migration_from(&self, from_version: &str) -> Option<&Migration> {
        self.migrations.get(from_version)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn canonical_json_sorts_keys_at_every_level() {
        assert_eq!(
            canonical_json(&json!({"b": 1, "a": {"d": [1, {"z": 0, "y": "é"}], "c": null}})),
            r#"{"a":{"c":null,"d":[1,{"y":"é","z":0}]},"b":1}"#
        );
    }

    #[test]
    fn input_hash_depends_on_every_part_of_the_request() {
        let base = ModelRequest::new("x", VersionRef::new("p", "1"), json!({"a": 1, "b": 2}));
        let h = base.input_hash();
        assert_eq!(h, ModelRequest::new("x", VersionRef::new("p", "1"), json!({"b": 2, "a": 1})).input_hash());
        assert_ne!(h, base.clone().params(json!({"temperature": 1})).input_hash());
        assert_ne!(h, ModelRequest::new("x", VersionRef::new("p", "2"), json!({"a": 1, "b": 2})).input_hash());
        assert_ne!(
            ModelRequest::new("x", VersionRef::new("ab", "c"), json!(1)).input_hash(),
            ModelRequest::new("x", VersionRef::new("a", "bc"), json!(1)).input_hash()
        );
    }

    #[test]
    fn schema_validates_and_refuses_to_compile_garbage() {
        let s =
            OutputSchema::new(VersionRef::new("inv", "1"), json!({"type": "object", "required": ["total"]})).unwrap();
        assert!(s.errors(&json!({"total": 1})).is_empty());
        assert_eq!(s.errors(&json!({})).len(), 1);
        assert!(OutputSchema::new(VersionRef::new("inv", "1"), json!({"type": "nonsense"})).is_err());
        assert!(OutputSchema::new(VersionRef::new("", "1"), json!({})).is_err());
    }
}
