//! The retry of a step whose last attempt ended with an unknown outcome (K-17.2).

use crate::activity::{Activity, ActivityContext, ActivityError, StepOutcome};
use std::sync::Arc;

/// The retry of a step whose last attempt ended with an unknown outcome (K-17.2): the
/// query hook first; the activity only when the operation did not take effect.
pub(super) struct QueryFirst {
    pub(super) query: Arc<dyn crate::definition::OutcomeQuery>,
    pub(super) activity: Arc<dyn Activity>,
}

#[async_trait::async_trait]
impl Activity for QueryFirst {
    async fn run(&self, ctx: ActivityContext) -> Result<StepOutcome, ActivityError> {
        match self.query.query(&ctx).await? {
            crate::definition::QueryAnswer::Done(output) => Ok(StepOutcome::Complete(output)),
            crate::definition::QueryAnswer::NotDone => self.activity.run(ctx).await,
            crate::definition::QueryAnswer::StillUnknown => {
                Err(ActivityError::unknown_outcome("the query could not tell whether the operation took effect"))
            }
        }
    }
}
