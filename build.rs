//! Fails the build when `spec/openapi.json` changed but the generated code
//! was not regenerated from it: both generated files carry the blake3 of the
//! spec they came from (`// spec-blake3: …`), which must equal the spec's.

use std::path::Path;

const SPEC: &str = "spec/openapi.json";
const GENERATED: &[&str] = &["server/src/generated.rs", "client/src/generated.rs"];

fn main() {
    println!("cargo:rerun-if-changed={SPEC}");
    for g in GENERATED {
        println!("cargo:rerun-if-changed={g}");
    }
    let spec = std::fs::read(SPEC).unwrap_or_else(|e| panic!("reading {SPEC}: {e}"));
    let hash = blake3::hash(&spec).to_hex().to_string();
    let stale: Vec<&str> =
        GENERATED.iter().copied().filter(|g| stamp(Path::new(g)).as_deref() != Some(hash.as_str())).collect();
    if !stale.is_empty() {
        eprintln!("spec changed: run `cargo xtask regen` ({} generated from another spec)", stale.join(", "));
        panic!("spec changed: run `cargo xtask regen`");
    }
}

fn stamp(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    text.lines().take(5).find_map(|l| l.strip_prefix("// spec-blake3: ")).map(|s| s.trim().to_string())
}
