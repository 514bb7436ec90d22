//! Prints the OpenAPI document dropshot builds from the generated trait.
fn main() {
    let api = sparring_server::sparring_api_mod::stub_api_description().expect("valid API description");
    api.openapi("Sparring API", semver::Version::new(1, 0, 0)).write(&mut std::io::stdout()).expect("stdout");
}
