//! The seed's story on in-memory adapters, no servers needed.
//!
//! Two listeners subscribe to the summary of a live talk that has not ended yet. Their
//! summary workflows wait for a "live ready" signal, which a fan-out workflow delivers once
//! the live ends. Each summary then transcribes the audio with one asynchronous ASR job
//! (polled with durable sleeps, never re-submitted), composes a summary written to the
//! business object under its fencing token, and finalizes. Four workers A–D share the
//! work; the worker composing the first summary dies mid-compose, after its business write
//! but before its CompleteStep. Another worker takes over after the lease, the compose
//! activity short-circuits on the business fact, and the dead worker's late write is fenced.
//!
//! Run: `cargo run -p kernel-examples --example live_summary`

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    kernel_examples::story::run(testkit::harness::World::with_limits(42, kernel_examples::story::limits())).await
}
