//! Logins whose password exists only while the gateway logs in. A provider whose login roles
//! the agent can reach directly (`template`: a shared server, where every role may change its
//! own password) puts a [`LoginGate`] on the target: before each login the gate gives the role
//! a fresh password and opens it, after the login it closes it again and checks that nobody
//! changed it meanwhile. [`login`] is the one place the startups ([`super::startup`], the
//! review's) go through it.

use std::future::Future;
use std::pin::Pin;

use super::BackendTarget;

/// A boxed future (the gate is a trait object).
pub type GateFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// One open login window: the password to log in with, and what the gate needs to close it.
pub struct Window {
    /// The one-login password.
    pub password: String,
    /// The gate's own state (locks held until closed, what it set).
    pub state: Box<dyn std::any::Any + Send>,
}

/// Opens a role for one login and closes it after.
pub trait LoginGate: Send + Sync + std::fmt::Debug {
    /// Gives `user` a fresh password valid for this login alone.
    fn open<'a>(&'a self, user: &'a str) -> GateFuture<'a, Result<Window, String>>;
    /// Closes the window (whether or not the login worked); an error means the role was
    /// tampered with meanwhile, and the login must not be used.
    fn close<'a>(&'a self, user: &'a str, window: Window) -> GateFuture<'a, Result<(), String>>;
}

/// Runs `connect` with the target's password, or, when the target has a gate, inside one
/// open window with the window's password. `gate_err` turns the gate's refusal into the
/// caller's error; a connection made in a window found tampered with is dropped.
pub async fn login<T, E>(
    target: &BackendTarget,
    connect: impl AsyncFnOnce(&BackendTarget) -> Result<T, E>,
    gate_err: impl Fn(String) -> E,
) -> Result<T, E> {
    let Some(gate) = target.gate.clone() else {
        return connect(target).await;
    };
    let window = gate.open(&target.user).await.map_err(&gate_err)?;
    let mut t = target.clone();
    t.password = Some(window.password.clone());
    t.gate = None;
    let made = connect(&t).await;
    gate.close(&target.user, window).await.map_err(&gate_err)?;
    made
}
