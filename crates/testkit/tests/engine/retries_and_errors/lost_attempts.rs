//! A lost attempt is an unknown outcome (K-17.2 amendment): a step found `running` when a
//! claim starts — its previous attempt was lost to a crash or a lease loss — may already
//! have taken effect, so a step that declares an outcome query is queried before it is
//! entered again.

use kernel_core::definition::QueryAnswer;
use kernel_core::*;
use serde_json::json;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use testkit::faults::{CrashPlan, CrashSwitch};
use testkit::harness::World;

/// What the payment provider saw: charges made, queries answered.
#[derive(Default)]
struct Provider {
    charges: AtomicU64,
    queries: AtomicU64,
}

/// `charge` charges the provider; the first time, the process dies right after (the reply
/// is never written). Its outcome query asks the provider whether the charge went through.
fn payment(provider: Arc<Provider>, die: Arc<OnceLock<Arc<CrashSwitch>>>) -> Definition {
    let p = provider.clone();
    let charge = move |_c: ActivityContext| {
        let (p, die) = (p.clone(), die.clone());
        async move {
            if p.charges.fetch_add(1, Ordering::SeqCst) == 0 {
                if let Some(switch) = die.get() {
                    switch.crash_now();
                }
            }
            Ok(StepOutcome::complete(json!({ "charged": true })))
        }
    };
    let query = move |_c: ActivityContext| {
        let p = provider.clone();
        async move {
            p.queries.fetch_add(1, Ordering::SeqCst);
            Ok(if p.charges.load(Ordering::SeqCst) > 0 {
                QueryAnswer::Done(json!({ "charged": true }))
            } else {
                QueryAnswer::NotDone
            })
        }
    };
    Definition::builder("pay").step(StepDef::new("charge", charge).on_unknown_outcome(query)).build().unwrap()
}

/// K-17.2: A dies after the provider charged and before the completion was written; B
/// takes the claim over after A's lease and finds `charge` running. It asks the provider
/// first and completes the step from the answer: one charge, one query.
#[tokio::test]
async fn a_step_found_running_is_queried_before_it_is_entered_again() {
    let world = World::new(31);
    let provider = Arc::new(Provider::default());
    let die = Arc::new(OnceLock::new());
    let (a, switch) = world.crashing_engine("A", vec![payment(provider.clone(), die.clone())], CrashPlan::Never);
    let _ = die.set(switch.clone());
    world.start_as(&a, "pay", "pay-1", "wf-pay").await;
    let zombie = tokio::spawn(async move { a.tick().await });
    switch.wait_crashed().await;
    let b = world.engine("B", vec![payment(provider.clone(), Arc::new(OnceLock::new()))]);
    world.drive(&b).await.unwrap();
    let inst = world.store.peek("wf-pay").unwrap();
    assert_eq!(inst.status, WorkflowStatus::Completed, "{inst:?}");
    let (charges, queries) = (provider.charges.load(Ordering::SeqCst), provider.queries.load(Ordering::SeqCst));
    assert_eq!((charges, queries), (1, 1), "charges={charges} queries={queries}");
    zombie.abort();
}
