//! Retries and errors (K-6.4, K-7.3, K-7.4, K-17.2): what the engine does with an activity's
//! error, a refused or unreachable write, a lost reply or a lost attempt, and bad input.

mod bad_input;
mod lost_attempts;
mod lost_replies;
mod prepare_context;
mod refused_writes;
mod retries;
mod stored_errors;
