//! Costs of the happy path, counted, not timed (K-6.1, K-7.1, K-13, K-15): store calls, writes,
//! observations and round trips to the ready lanes per workflow.

mod hot_path_counts;
mod round_trips;
mod write_budget;
