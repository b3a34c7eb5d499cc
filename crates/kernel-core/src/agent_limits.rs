//! The limits of a bounded agent step (K-17.1 amendment), declared with the step and
//! checked when a definition is built. The agent loop itself is a layer above the kernel
//! (the `kernel-agents` crate); the kernel only validates and fingerprints the limits.

use crate::error::{Error, Result};
use crate::record::RECORD_ENTRIES_MAX;
use crate::time::DurationMs;

/// Upper bound on an agent's declared sub-steps (proposals and tool calls together): the
/// step's record holds every one of them, within [`RECORD_ENTRIES_MAX`].
pub const AGENT_SUB_STEPS_MAX: u32 = 200;

/// The limits of a bounded agent, enforced across its whole loop. An agent needs all of a
/// sub-step bound, a deadline and a budget (tokens or cost, or both): a definition with an
/// agent step missing one is refused when it is built.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AgentLimits {
    /// Most sub-steps (proposals and tool calls together), 1..=[`AGENT_SUB_STEPS_MAX`].
    pub max_sub_steps: u32,
    /// Most tokens (input and output, summed over every recorded proposal).
    pub max_tokens: Option<u64>,
    /// Most cost in micro-units, summed over every recorded proposal.
    pub max_cost_micros: Option<u64>,
    /// Time from the agent's recorded start after which no new sub-step begins.
    pub deadline_ms: Option<DurationMs>,
}

impl AgentLimits {
    /// Refuse limits that do not bound the loop, as [`Error::InvalidInput`] on `field`.
    pub fn validate(&self, field: &str) -> Result<()> {
        if self.max_sub_steps == 0 || self.max_sub_steps > AGENT_SUB_STEPS_MAX {
            return Err(Error::invalid(
                format!("{field}.max_sub_steps"),
                format_args!("{} is not within 1..={AGENT_SUB_STEPS_MAX}", self.max_sub_steps),
            ));
        }
        match self.deadline_ms {
            None => return Err(Error::invalid(format!("{field}.deadline_ms"), "an agent needs a deadline")),
            Some(d) => crate::validate::config_ms(&format!("{field}.deadline_ms"), d)?,
        }
        if self.max_tokens.is_none() && self.max_cost_micros.is_none() {
            return Err(Error::invalid(format!("{field}.budget"), "an agent needs a token or cost budget"));
        }
        if self.max_tokens == Some(0) || self.max_cost_micros == Some(0) {
            return Err(Error::invalid(format!("{field}.budget"), "a budget of 0 allows nothing"));
        }
        Ok(())
    }
}

const _: () = assert!(AGENT_SUB_STEPS_MAX as usize + 2 <= RECORD_ENTRIES_MAX);
