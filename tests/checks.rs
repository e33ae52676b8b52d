//! Checks that start no gateway: one-way layering, docs in step with the code, the container
//! files, the Kubernetes manifests, the set-up script, the fuzz targets over their corpora, the
//! compact log codec.

// Each suite uses only part of the shared helpers.
#[allow(dead_code)]
mod support;

/// One file per concern, in tests/checks/.
mod checks {
    mod docker_configs;
    mod docs;
    mod fuzz_smoke;
    mod kubernetes;
    mod layering;
    mod log_compact;
    mod setup_script;
}
