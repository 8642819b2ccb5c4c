//! The real MCP TypeScript SDK (`@modelcontextprotocol/sdk`, from npm; `cargo xtask test`
//! installs it and names it in `REAPER_MCP_SDK`): a Node MCP host whose stdio server never
//! answers `initialize` is flagged with the SDK's spawn function named. Host only.
use reaper_tests::{PERF_MAP, frame, node_spawned_at as spawned_at, require_root, skip};

#[test]
fn a_node_mcp_hosts_flag_names_the_sdks_spawn_function() {
    let test = "a_node_mcp_hosts_flag_names_the_sdks_spawn_function";
    if !require_root(test) {
        return;
    }
    let Some(sdk) = std::env::var_os("REAPER_MCP_SDK") else {
        skip(
            test,
            "REAPER_MCP_SDK names no install of the MCP SDK (cargo xtask test makes one)",
        );
        return;
    };
    let how = format!("sdk:{}", sdk.to_str().unwrap());
    let (frames, _) = spawned_at(test, &how, PERF_MAP);
    // `StdioClientTransport.start` spawns through cross-spawn, from a promise's executor.
    let start = frame(&frames, "start");
    assert_eq!(start["language"], "javascript", "{start}");
    assert!(
        start["file"]
            .as_str()
            .unwrap()
            .ends_with("/@modelcontextprotocol/sdk/dist/cjs/client/stdio.js"),
        "{start}"
    );
    frame(&frames, "connectToServer");
    // The readable line names the SDK past node's and cross-spawn's own frames.
    let named: Vec<reaper_user::testing::Frame> =
        serde_json::from_value(serde_json::Value::Array(frames.clone())).unwrap();
    let text = reaper_user::testing::spawn_site_text(&named).unwrap();
    assert!(text.contains("start (stdio.js:"), "{text}");
    assert!(
        !text.contains("index.js:7"),
        "cross-spawn is skipped: {text}"
    );
}
