//! The test PostgreSQL of `e2e/postgres/start.sh`, for every test binary that needs it: its URL
//! comes from `SANDBOXRUN_TEST_POSTGRES_URL` (the reader role's URL, the last line start.sh
//! prints). Without it a test is skipped with a note, unless `SANDBOXRUN_REQUIRE_POSTGRES=1`
//! (CI), where it fails.

/// The test database's URL, or `None` (after a note) when the test should be skipped.
pub fn postgres_url() -> Option<String> {
    match std::env::var("SANDBOXRUN_TEST_POSTGRES_URL") {
        Ok(url) if !url.trim().is_empty() => Some(url.trim().to_owned()),
        _ => {
            assert_ne!(
                std::env::var("SANDBOXRUN_REQUIRE_POSTGRES").as_deref(),
                Ok("1"),
                "SANDBOXRUN_REQUIRE_POSTGRES=1 but SANDBOXRUN_TEST_POSTGRES_URL is not set: run \
                 e2e/postgres/start.sh and export SANDBOXRUN_TEST_POSTGRES_URL=<the URL on its \
                 last line>"
            );
            eprintln!(
                "note: skipping PostgreSQL test: SANDBOXRUN_TEST_POSTGRES_URL is not set (run \
                 e2e/postgres/start.sh and export the URL it prints)"
            );
            None
        }
    }
}
