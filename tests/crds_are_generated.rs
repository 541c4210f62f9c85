//! `crds/` must be exactly what `agentrt crds` prints, and docs/reference.md what `agentrt crds
//! --markdown` prints (issues 3 and 14): the CRDs are generated from
//! the Rust types in `src/api/`, never edited by hand.

#[test]
fn crds_directory_matches_the_generated_crds() {
    let files = agentrt::api::crd_files().expect("the CRDs serialize");
    for (name, yaml) in files {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("crds")
            .join(name);
        let stored = std::fs::read_to_string(&path)
            .unwrap_or_else(|err| panic!("cannot read {}: {err}", path.display()));
        assert!(
            stored == format!("---\n{yaml}"),
            "{} differs from `agentrt crds`; regenerate with scripts/gen-crds",
            path.display()
        );
    }
}

#[test]
fn agentrt_crds_prints_the_files_of_crds_in_order() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_agentrt"))
        .arg("crds")
        .output()
        .expect("agentrt runs");
    assert!(out.status.success());
    let mut expected = String::new();
    for name in [
        "agentpolicies.yaml",
        "agentruns.yaml",
        "agentrunsegments.yaml",
        "approvals.yaml",
        "clusteragentpolicies.yaml",
    ] {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("crds")
            .join(name);
        expected.push_str(&std::fs::read_to_string(path).expect("crds file exists"));
    }
    assert_eq!(String::from_utf8_lossy(&out.stdout), expected);
}

#[test]
fn docs_reference_is_what_agentrt_crds_markdown_prints() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/reference.md");
    let stored = std::fs::read_to_string(&path).expect("docs/reference.md exists");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_agentrt"))
        .args(["crds", "--markdown"])
        .output()
        .expect("agentrt runs");
    assert!(out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stdout) == stored,
        "docs/reference.md differs from `agentrt crds --markdown`; regenerate with scripts/gen-crds"
    );
}
