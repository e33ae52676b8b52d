//! Tests of the SCRAM server: real rust-postgres client, RFC vectors, malformed input,
//! channel binding.
use super::*;
use crate::auth::token::{new_secret, Verifier};
use postgres_protocol::authentication::sasl::{ChannelBinding, ScramSha256};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Runs a full exchange with rust-postgres' SCRAM client; returns the server's verdict
/// and whether the client accepted our server signature.
fn exchange(verifier: &ScramVerifier, password: &str) -> Result<(), ScramError> {
    let mut client = ScramSha256::new(password.as_bytes(), ChannelBinding::unsupported());
    let (state, server_first) = ScramServer::start(verifier, client.message())?;
    client
        .update(&server_first)
        .expect("client accepts server-first");
    let server_final = state.finish(client.message())?;
    client
        .finish(&server_final)
        .expect("client accepts our server signature");
    Ok(())
}

fn client_first(cb: ChannelBinding) -> Vec<u8> {
    ScramSha256::new(b"x", cb).message().to_vec()
}

#[test]
fn round_trip_with_postgres_client() {
    let secret = new_secret();
    let v = Verifier::from_secret(&secret);
    exchange(&v.scram, &secret).unwrap();
}

#[test]
fn round_trip_survives_json() {
    let secret = new_secret();
    let v = Verifier::from_secret(&secret);
    let back: Verifier = serde_json::from_str(&serde_json::to_string(&v).unwrap()).unwrap();
    exchange(&back.scram, &secret).unwrap();
}

#[test]
fn round_trip_with_y_flag() {
    // "y,," = client supports channel binding but thinks we do not.
    let secret = new_secret();
    let v = Verifier::from_secret(&secret);
    let mut client = ScramSha256::new(secret.as_bytes(), ChannelBinding::unrequested());
    assert!(client.message().starts_with(b"y,,"));
    let (state, server_first) = ScramServer::start(&v.scram, client.message()).unwrap();
    client.update(&server_first).unwrap();
    let server_final = state.finish(client.message()).unwrap();
    client.finish(&server_final).unwrap();
}

#[test]
fn wrong_secret_is_bad_proof() {
    let v = Verifier::from_secret(&new_secret());
    let mut client = ScramSha256::new(new_secret().as_bytes(), ChannelBinding::unsupported());
    let (state, server_first) = ScramServer::start(&v.scram, client.message()).unwrap();
    client.update(&server_first).unwrap();
    assert!(matches!(
        state.finish(client.message()),
        Err(ScramError::BadProof)
    ));
}

#[test]
fn server_first_shape() {
    let v = Verifier::from_secret("pw");
    let cf = b"n,,n=,r=abcdefghijklmnopqrstuvwx";
    let (_, sf) = ScramServer::start(&v.scram, cf).unwrap();
    let sf = String::from_utf8(sf).unwrap();
    let parts: Vec<&str> = sf.split(',').collect();
    assert_eq!(parts.len(), 3, "{sf}");
    let nonce = parts[0].strip_prefix("r=abcdefghijklmnopqrstuvwx").unwrap();
    assert_eq!(nonce.len(), 24);
    assert_eq!(STANDARD.decode(nonce).unwrap().len(), 18);
    assert_eq!(parts[1], format!("s={}", v.scram.salt));
    assert_eq!(parts[2], "i=4096");
}

#[test]
fn rfc7677_vector() {
    // RFC 7677 section 3, with the server nonce pinned.
    let salt = STANDARD.decode("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap();
    let v = ScramVerifier::derive(b"pencil", &salt, 4096);
    let (state, sf) = start_with_nonce(
        &v,
        b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO",
        "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0",
        Binding::default(),
    )
    .unwrap();
    assert_eq!(
        sf,
        b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    );
    let sfin = state
        .finish(b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
        .unwrap();
    assert_eq!(sfin, b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=");
}

#[test]
fn channel_binding_p_is_unsupported() {
    let v = Verifier::from_secret("pw");
    for cf in [&b"p=tls-server-end-point,,n=,r=abc"[..], b"p=,,n=,r=abc"] {
        assert!(matches!(
            ScramServer::start(&v.scram, cf),
            Err(ScramError::ChannelBindingUnsupported)
        ));
    }
    let real = client_first(ChannelBinding::tls_server_end_point(vec![1, 2, 3]));
    assert!(matches!(
        ScramServer::start(&v.scram, &real),
        Err(ScramError::ChannelBindingUnsupported)
    ));
}

#[test]
fn malformed_client_first() {
    let v = Verifier::from_secret("pw");
    let huge = vec![b'a'; 1 << 20];
    let long_nonce = format!("n,,n=,r={}", "a".repeat(MAX_NONCE_LEN + 1));
    let cases: Vec<&[u8]> = vec![
        b"",
        b",",
        b"garbage",
        b"n",
        b"n,",
        b"n,,",
        b"n,,n=",
        b"n,,r=abc",
        b"n,,n=,",
        b"n,,n=,r=",
        b"n,,n=,r=a b",
        b"n,,n=,r=abc\x7f",
        b"n,,n=,x=abc",
        b"n,a=admin,n=,r=abc",
        b"m=ext,,n=,r=abc",
        b"n,,m=ext,n=,r=abc",
        b"x,,n=,r=abc",
        b"nn,,n=,r=abc",
        b"n,,n=,r=abc,bogus",
        b"n,,n=,r=abc,=x",
        b"n,,n=,r=\xff\xfe",
        b"\xff,,n=,r=abc",
        b"n,,n=\xc3,r=abc",
        long_nonce.as_bytes(),
        &huge,
    ];
    for cf in cases {
        let r = ScramServer::start(&v.scram, cf);
        assert!(
            matches!(r, Err(ScramError::Malformed(_))),
            "{:?} -> {:?}",
            String::from_utf8_lossy(&cf[..cf.len().min(40)]),
            r.map(|(_, m)| m)
        );
    }
    // Extensions after the nonce are allowed.
    assert!(ScramServer::start(&v.scram, b"n,,n=,r=abc,x=1").is_ok());
}

/// A fresh server state for client nonce "abc", plus the combined nonce.
/// The server nonce is pinned so that every state expects the same r=.
fn started(v: &ScramVerifier) -> (ScramServerFirst, String) {
    let (state, sf) =
        start_with_nonce(v, b"n,,n=,r=abc", "c2VydmVybm9uY2U", Binding::default()).unwrap();
    let sf = String::from_utf8(sf).unwrap();
    let nonce = sf.split(',').next().unwrap()[2..].to_owned();
    (state, nonce)
}

#[test]
fn malformed_client_final() {
    let v = Verifier::from_secret("pw");
    let proof = STANDARD.encode([0u8; 32]);
    let (_, n) = started(&v.scram);
    let huge = format!("c=biws,r={n},p={}", "A".repeat(1 << 20));
    let cases: Vec<String> = vec![
        "".into(),
        "garbage".into(),
        ",p=".into(),
        format!("c=biws,r={n}"),               // no proof
        format!("c=biws,p={proof}"),           // no nonce
        format!("r={n},p={proof}"),            // no c=
        format!("c=biws,r={n},p="),            // empty proof
        format!("c=biws,r={n},p=!!!!"),        // bad base64
        format!("c=biws,r={n},p=AAAA"),        // short proof
        format!("c=biws,r={n},p={proof}AAAA"), // bad padding / long
        format!("c=@@@@,r={n},p={proof}"),     // bad base64 c=
        format!("c=eSws,r={n},p={proof}"),     // y,, but we saw n,,
        format!("c=,r={n},p={proof}"),
        format!("c=biws,r={n},junk,p={proof}"),
        format!("c=biws,x={n},p={proof}"),
        format!("c=biws\u{e9},r={n},p={proof}"),
        huge,
    ];
    for cf in cases {
        let (state, _) = started(&v.scram);
        let r = state.finish(cf.as_bytes());
        assert!(
            matches!(r, Err(ScramError::Malformed(_))),
            "{cf:.60} -> {r:?}"
        );
    }
    let (state, _) = started(&v.scram);
    assert!(state.finish(b"c=biws,r=abc\xff,p=x").is_err());
}

#[test]
fn wrong_nonce() {
    let v = Verifier::from_secret("pw");
    let proof = STANDARD.encode([0u8; 32]);
    let (_, n) = started(&v.scram);
    for bad in [
        "abc".to_owned(),            // client nonce only
        format!("{n}x"),             // extended
        n[..n.len() - 1].to_owned(), // truncated
        "".to_owned(),
    ] {
        let (state, _) = started(&v.scram);
        let r = state.finish(format!("c=biws,r={bad},p={proof}").as_bytes());
        assert!(
            matches!(r, Err(ScramError::NonceMismatch)),
            "{bad} -> {r:?}"
        );
    }
    // Another session's nonce does not work either.
    let (state, _) = ScramServer::start(&v.scram, b"n,,n=,r=abc").unwrap();
    let r = state.finish(format!("c=biws,r={n},p={proof}").as_bytes());
    assert!(matches!(r, Err(ScramError::NonceMismatch)), "{r:?}");
}

#[test]
fn channel_binding_data_in_final_is_unsupported() {
    let v = Verifier::from_secret("pw");
    let (state, n) = started(&v.scram);
    let c = STANDARD.encode(b"p=tls-server-end-point,,\x01\x02");
    let proof = STANDARD.encode([0u8; 32]);
    let r = state.finish(format!("c={c},r={n},p={proof}").as_bytes());
    assert!(
        matches!(r, Err(ScramError::ChannelBindingUnsupported)),
        "{r:?}"
    );
}

#[test]
fn corrupt_verifier_fails_as_bad_proof() {
    let secret = new_secret();
    let good = Verifier::from_secret(&secret).scram;
    let mut corrupt = vec![];
    for f in 0..5 {
        let mut v = good.clone();
        match f {
            0 => v.salt = "not base64!".into(),
            1 => v.salt = String::new(),
            2 => v.iterations = 0,
            3 => v.stored_key = STANDARD.encode([0u8; 31]),
            _ => v.server_key = "%%".into(),
        }
        corrupt.push(v);
    }
    for v in &corrupt {
        assert!(
            matches!(exchange(v, &secret), Err(ScramError::BadProof)),
            "{v:?}"
        );
    }
}

#[test]
fn random_bytes_never_panic() {
    let v = Verifier::from_secret("pw").scram;
    let mut rng = StdRng::seed_from_u64(0x05a4_d917);
    let alphabet = b"nyp=,rcmxa0+/\xff\x00";
    for i in 0..20_000 {
        let len = rng.gen_range(0..64);
        let buf: Vec<u8> = if i % 2 == 0 {
            (0..len).map(|_| rng.gen()).collect()
        } else {
            // Bias towards SCRAM-looking bytes to get past the first checks.
            (0..len)
                .map(|_| alphabet[rng.gen_range(0..alphabet.len())])
                .collect()
        };
        let _ = ScramServer::start(&v, &buf);
        let (state, _) = started(&v);
        let _ = state.finish(&buf);
    }
}

#[test]
fn mutated_messages_never_panic() {
    let secret = new_secret();
    let v = Verifier::from_secret(&secret).scram;
    let mut rng = StdRng::seed_from_u64(7);
    let mut client = ScramSha256::new(secret.as_bytes(), ChannelBinding::unsupported());
    let cf = client.message().to_vec();
    // Pinned server nonce so that each fresh state accepts the (unmutated) client-final.
    let server_nonce = "Zm9vYmFyYmF6cXV4cXV1eGNvcmdl";
    let (_, sf) = start_with_nonce(&v, &cf, server_nonce, Binding::default()).unwrap();
    client.update(&sf).unwrap();
    let cfin = client.message().to_vec();
    let (state, _) = start_with_nonce(&v, &cf, server_nonce, Binding::default()).unwrap();
    assert!(
        state.finish(&cfin).is_ok(),
        "unmutated message authenticates"
    );
    for _ in 0..5_000 {
        let mut m = if rng.gen() { cf.clone() } else { cfin.clone() };
        for _ in 0..rng.gen_range(1..4) {
            match rng.gen_range(0..3) {
                0 if !m.is_empty() => {
                    let i = rng.gen_range(0..m.len());
                    m[i] = rng.gen();
                }
                1 if !m.is_empty() => {
                    let i = rng.gen_range(0..m.len());
                    m.truncate(i);
                }
                _ => {
                    let i = rng.gen_range(0..=m.len());
                    m.insert(i, rng.gen());
                }
            }
        }
        let _ = ScramServer::start(&v, &m);
        let (state, _) = start_with_nonce(&v, &cf, server_nonce, Binding::default()).unwrap();
        let r = state.finish(&m);
        // A changed client-final must never authenticate.
        if m != cfin {
            assert!(r.is_err(), "{:?}", String::from_utf8_lossy(&m));
        }
    }
}

/// A full SCRAM-SHA-256-PLUS exchange with rust-postgres' client binding to `client_cb`
/// while the server offered `server_cb`.
fn plus_exchange(
    v: &ScramVerifier,
    secret: &str,
    client_cb: &[u8],
    server_cb: &[u8],
) -> Result<(), ScramError> {
    let mut client = ScramSha256::new(
        secret.as_bytes(),
        ChannelBinding::tls_server_end_point(client_cb.to_vec()),
    );
    assert!(client.message().starts_with(b"p=tls-server-end-point,,"));
    let binding = Binding {
        offered: Some(server_cb),
        plus: true,
    };
    let (state, sf) = ScramServer::start_bound(v, client.message(), binding)?;
    client.update(&sf).expect("client accepts server-first");
    let server_final = state.finish(client.message())?;
    client
        .finish(&server_final)
        .expect("client accepts our server signature");
    Ok(())
}

#[test]
fn plus_round_trip_with_postgres_client() {
    let secret = new_secret();
    let v = Verifier::from_secret(&secret);
    let cert_hash = Sha256::digest(b"a certificate").to_vec();
    plus_exchange(&v.scram, &secret, &cert_hash, &cert_hash).unwrap();
}

#[test]
fn plus_with_another_certificate_fails() {
    // A man in the middle terminates TLS with its own certificate: the client binds to that.
    let secret = new_secret();
    let v = Verifier::from_secret(&secret);
    let ours = Sha256::digest(b"our certificate").to_vec();
    let theirs = Sha256::digest(b"their certificate").to_vec();
    assert!(matches!(
        plus_exchange(&v.scram, &secret, &theirs, &ours),
        Err(ScramError::ChannelBindingMismatch)
    ));
}

#[test]
fn plus_negotiation_errors() {
    let v = Verifier::from_secret("pw").scram;
    let data = [7u8; 32];
    let offered = Binding {
        offered: Some(&data),
        plus: false,
    };
    let plus = Binding {
        offered: Some(&data),
        plus: true,
    };
    let not_offered_plus = Binding {
        offered: None,
        plus: true,
    };
    let neg = |r: Result<(ScramServerFirst, Vec<u8>), ScramError>| {
        matches!(r, Err(ScramError::ChannelBindingNegotiation(_)))
    };
    // "y" where -PLUS was offered: a downgrade.
    assert!(neg(ScramServer::start_bound(&v, b"y,,n=,r=abc", offered)));
    // -PLUS chosen without binding data, or with "p" under the plain mechanism.
    assert!(neg(ScramServer::start_bound(&v, b"n,,n=,r=abc", plus)));
    assert!(neg(ScramServer::start_bound(&v, b"y,,n=,r=abc", plus)));
    assert!(neg(ScramServer::start_bound(
        &v,
        b"p=tls-server-end-point,,n=,r=abc",
        offered
    )));
    assert!(neg(ScramServer::start_bound(
        &v,
        b"p=tls-unique,,n=,r=abc",
        plus
    )));
    assert!(neg(ScramServer::start_bound(
        &v,
        b"p=tls-server-end-point,,n=,r=abc",
        not_offered_plus
    )));
    // Plain SCRAM over TLS with "n" is fine (clients that cannot bind, like sqlx).
    assert!(ScramServer::start_bound(&v, b"n,,n=,r=abc", offered).is_ok());
    // And the plain exchange completes with the offer made.
    let secret = new_secret();
    let ver = Verifier::from_secret(&secret);
    let mut client = ScramSha256::new(secret.as_bytes(), ChannelBinding::unsupported());
    let (state, sf) = ScramServer::start_bound(&ver.scram, client.message(), offered).unwrap();
    client.update(&sf).unwrap();
    let fin = state.finish(client.message()).unwrap();
    client.finish(&fin).unwrap();
}

#[test]
fn plus_final_must_carry_the_binding() {
    // Header says p=, but c= holds only the header (no certificate hash) or another one.
    let v = Verifier::from_secret("pw").scram;
    let data = [9u8; 32];
    let plus = Binding {
        offered: Some(&data),
        plus: true,
    };
    let proof = STANDARD.encode([0u8; 32]);
    for c in [
        b"p=tls-server-end-point,,".to_vec(),
        b"n,,".to_vec(),
        [&b"p=tls-server-end-point,,"[..], &[8u8; 32]].concat(),
        [&b"p=tls-server-end-point,,"[..], &data[..31]].concat(),
    ] {
        let (state, sf) =
            ScramServer::start_bound(&v, b"p=tls-server-end-point,,n=,r=abc", plus).unwrap();
        let sf = String::from_utf8(sf).unwrap();
        let nonce = &sf.split(',').next().unwrap()[2..];
        let r = state.finish(format!("c={},r={nonce},p={proof}", STANDARD.encode(&c)).as_bytes());
        assert!(
            matches!(r, Err(ScramError::ChannelBindingMismatch)),
            "{r:?}"
        );
    }
}
