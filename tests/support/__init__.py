"""What the tests share and no test is: tiny models and data built on the spot, a fake encoder,
exports cached per session, example store specs, the local database servers and the loader of
benchmark scripts. Nothing here is shipped in the wheel."""
