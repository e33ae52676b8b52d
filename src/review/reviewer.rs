//! The reviewer: what taking and storing reviews needs from the gateway (provider, the
//! `[review]` settings, where logs and reviews live), in one place.

use std::path::PathBuf;
use std::sync::Arc;

use crate::config::{Config, ReviewConfig};
use crate::journal::log::LogPlace;
use crate::provider::Provider;

/// What taking and storing reviews needs from the gateway, handed in by the caller (the
/// review never reaches for the gateway itself).
#[derive(Clone)]
pub struct Reviewer {
    /// Where scratch and reference databases come from.
    pub provider: Arc<dyn Provider>,
    /// The `[review]` settings.
    pub settings: ReviewConfig,
    /// The gateway's data dir (the free space a verification fork needs).
    pub data_dir: PathBuf,
    /// Where statement logs are read from (the data dir, or the fronts' shared directory).
    pub logs: LogPlace,
    /// Where reviews are stored ([`reviews_dir`]).
    pub dir: PathBuf,
    /// `limits.min_free_bytes`: no verification fork below it.
    pub min_free_bytes: u64,
    /// The gateway's id, tagged on the forks the review makes (the janitor's ownership).
    pub gateway_id: String,
}

impl Reviewer {
    /// The reviewer of a gateway with this configuration and provider.
    pub fn new(cfg: &Config, provider: Arc<dyn Provider>, gateway_id: &str) -> Reviewer {
        Reviewer {
            provider,
            settings: cfg.review.clone(),
            data_dir: cfg.data_dir.clone(),
            logs: cfg.log_place(),
            dir: reviews_dir(cfg),
            min_free_bytes: cfg.limits.min_free_bytes,
            gateway_id: gateway_id.to_string(),
        }
    }
}

/// Directory of stored reviews (and their decisions): `review.dir`, else
/// `<registry.shared_dir>/reviews` (any front reads them), else `<data dir>/reviews`.
pub fn reviews_dir(cfg: &Config) -> PathBuf {
    match (&cfg.review.dir, &cfg.registry.shared_dir) {
        (Some(d), _) => d.clone(),
        (None, Some(shared)) => shared.join("reviews"),
        (None, None) => cfg.data_dir.join("reviews"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reviews_go_to_review_dir_else_the_shared_dir_else_the_data_dir() {
        let mut c = Config::default();
        assert_eq!(reviews_dir(&c), c.data_dir.join("reviews"));
        c.registry.shared_dir = Some(PathBuf::from("/mnt/fronts"));
        assert_eq!(reviews_dir(&c), PathBuf::from("/mnt/fronts/reviews"));
        c.review.dir = Some(PathBuf::from("/r"));
        assert_eq!(reviews_dir(&c), PathBuf::from("/r"));
    }
}
