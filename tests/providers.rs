//! Where scratch databases come from: the spine on every provider, the `instance` provider's
//! isolation, goldens from a live database, replicas on a shared registry, worker nodes, the
//! `template` provider against a hostile task role, fronts that share one log and review,
//! and the `microvm` provider.

// Each suite uses only part of the shared helpers.
#[allow(dead_code)]
mod support;

/// One file per concern, in tests/providers/.
mod providers {
    mod fleet_scale;
    mod fronts;
    mod fronts_limits;
    mod golden_build;
    mod instance_provider;
    mod microvm;
    mod registry_pool;
    mod replicas;
    mod spines;
    mod template_attacks;
    mod template_claims;
    mod template_noise;
    mod template_seatbelt;
    mod worker;
    mod worker_goldens;
    mod worker_loss;
    mod worker_placement;
}
