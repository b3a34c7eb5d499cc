//! `wfk`: the stock command line (no workflow definitions; see the crate docs to build one
//! with yours).

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let code = wfk::run(std::env::args().skip(1), vec![], &mut std::io::stdout(), &mut std::io::stderr()).await;
    std::process::exit(code.into());
}
