//! The one rule for tests that need a server (MongoDB, Redis): under CI a missing server
//! is a failure, elsewhere the test is skipped with the reason printed.
//!
//! CI is `CI=true` or `CI=1` (any case, surrounding blanks ignored), the values CI services
//! set; `.ci/run` sets `CI=true` itself so a local run behaves like CI. queue-redis's
//! `test_support::is_ci` (which cannot depend on this crate) applies the same rule, and a
//! test there checks that both agree.

/// Whether `value` (the `CI` variable, if set) means a CI run.
///
/// ```
/// use testkit::ci::ci_from;
/// assert!(ci_from(Some("true")) && ci_from(Some("1")) && ci_from(Some(" TRUE ")));
/// assert!(!ci_from(None) && !ci_from(Some("")) && !ci_from(Some("0")) && !ci_from(Some("false")));
/// ```
pub fn ci_from(value: Option<&str>) -> bool {
    value.is_some_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "true" | "1"))
}

/// Whether this run is CI, where a test that needs a missing server must fail.
pub fn is_ci() -> bool {
    ci_from(std::env::var("CI").ok().as_deref())
}

/// Skip (print `reason`, return `None`) outside CI; panic under CI.
///
/// ```
/// # if !testkit::ci::is_ci() {
/// let skipped: Option<()> = testkit::ci::skip_or_fail("demo", "MONGODB_URI is not set");
/// assert!(skipped.is_none());
/// # }
/// ```
pub fn skip_or_fail<T>(test: &str, reason: &str) -> Option<T> {
    if is_ci() {
        panic!("{test}: {reason}, but this is a CI run (CI=true or CI=1): the server is required");
    }
    eprintln!("SKIPPED {test}: {reason}");
    None
}
