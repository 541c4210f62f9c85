//! `agentrt console` without a browser (issue 39, docs/design.md section 2 "Console"): nothing
//! is answered without the printed token or the session cookie it is exchanged for, a POST
//! needs the session's CSRF token and a same-origin `Origin`, a foreign `Host` is refused, and
//! the console listens on loopback unless `--addr` says otherwise (with a warning).

mod support;

use reqwest::{header, redirect, StatusCode};
use support::console::ConsoleProcess;
use support::controller::agentrt_cluster;

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(redirect::Policy::none())
        .build()
        .expect("client")
}

/// The session cookie (`name=value`) the token is exchanged for, and the CSRF token of the
/// inbox's form.
async fn session(console: &ConsoleProcess) -> (String, String) {
    let answer = http().get(&console.url).send().await.expect("GET url");
    assert_eq!(
        answer.status(),
        StatusCode::SEE_OTHER,
        "the token is exchanged"
    );
    assert_eq!(
        answer.headers()[header::LOCATION],
        "/",
        "and taken out of the URL"
    );
    let set = answer.headers()[header::SET_COOKIE]
        .to_str()
        .expect("cookie")
        .to_string();
    assert!(set.contains("HttpOnly"), "{set}");
    assert!(set.contains("SameSite=Strict"), "{set}");
    let cookie = set.split(';').next().expect("name=value").to_string();
    let inbox = http()
        .get(format!("{}/", console.origin()))
        .header(header::COOKIE, &cookie)
        .send()
        .await
        .expect("GET /");
    assert_eq!(inbox.status(), StatusCode::OK);
    let html = inbox.text().await.expect("html");
    let csrf = html
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap_or_else(|| panic!("no CSRF token in the inbox: {html}"))
        .to_string();
    (cookie, csrf)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_refuses_requests_without_its_token_or_csrf() {
    let cluster = agentrt_cluster().await;
    let console = ConsoleProcess::start(&cluster);
    assert!(
        console.url.starts_with("http://127.0.0.1:"),
        "the URL is the last line on stdout: {}",
        console.url
    );
    let origin = console.origin();
    // No token, a wrong token, a made-up cookie: 403, and nothing of the page.
    for (url, cookie) in [
        (format!("{origin}/"), None),
        (format!("{origin}/?token=0000"), None),
        (format!("{origin}/"), Some("agentrt_console=guess")),
        (format!("{origin}/events"), None),
    ] {
        let mut request = http().get(&url);
        if let Some(cookie) = cookie {
            request = request.header(header::COOKIE, cookie);
        }
        let answer = request.send().await.expect("GET");
        assert_eq!(answer.status(), StatusCode::FORBIDDEN, "{url} {cookie:?}");
        assert!(!answer.text().await.unwrap().contains("data-approval"));
    }
    let (cookie, csrf) = session(&console).await;
    let decide = format!("{origin}/decide");
    let ns = cluster.namespace().to_string();
    let form = |csrf: &str| {
        vec![
            ("csrf".to_string(), csrf.to_string()),
            ("act".to_string(), format!("approve:{ns}/none")),
            (format!("hash:{ns}/none"), "sha256:00".to_string()),
        ]
    };
    // A POST without the CSRF token, or with another, is refused before anything is read.
    for csrf in ["", "not-the-token"] {
        let answer = http()
            .post(&decide)
            .header(header::COOKIE, &cookie)
            .form(&form(csrf))
            .send()
            .await
            .expect("POST");
        assert_eq!(answer.status(), StatusCode::FORBIDDEN, "csrf {csrf:?}");
        assert!(answer.text().await.unwrap().contains("CSRF"));
    }
    // With the token but from another origin (a page elsewhere posting to it): refused.
    let answer = http()
        .post(&decide)
        .header(header::COOKIE, &cookie)
        .header(header::ORIGIN, "http://evil.example")
        .form(&form(&csrf))
        .send()
        .await
        .expect("POST");
    assert_eq!(answer.status(), StatusCode::FORBIDDEN);
    // A foreign Host (DNS rebinding) is refused even with the session.
    let answer = http()
        .get(format!("{origin}/"))
        .header(header::COOKIE, &cookie)
        .header(header::HOST, "evil.example")
        .send()
        .await
        .expect("GET");
    assert_eq!(answer.status(), StatusCode::FORBIDDEN);
    // With everything in order the form reaches the API server, which has no such Approval.
    let answer = http()
        .post(&decide)
        .header(header::COOKIE, &cookie)
        .header(header::ORIGIN, &origin)
        .form(&form(&csrf))
        .send()
        .await
        .expect("POST");
    assert_eq!(answer.status(), StatusCode::CONFLICT);
    let html = answer.text().await.unwrap();
    assert!(html.contains("data-outcome=\"refused\""), "{html}");
    assert!(html.contains("not found"), "{html}");
    // Started with -n, the console decides nothing of another namespace, and shows none.
    let outside = vec![
        ("csrf".to_string(), csrf.clone()),
        (
            "act".to_string(),
            "reject:elsewhere/an-approval".to_string(),
        ),
        (
            "hash:elsewhere/an-approval".to_string(),
            "sha256:00".to_string(),
        ),
    ];
    let answer = http()
        .post(&decide)
        .header(header::COOKIE, &cookie)
        .header(header::ORIGIN, &origin)
        .form(&outside)
        .send()
        .await
        .expect("POST");
    let html = answer.text().await.unwrap();
    assert!(html.contains("outside it"), "{html}");
    let answer = http()
        .get(format!("{origin}/approvals/elsewhere/an-approval"))
        .header(header::COOKIE, &cookie)
        .send()
        .await
        .expect("GET");
    assert_eq!(answer.status(), StatusCode::FORBIDDEN);
    // No page may be framed by another (clickjacking), or cached.
    assert_eq!(answer.headers()["x-frame-options"], "DENY");
    assert_eq!(answer.headers()["cache-control"], "no-store");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_listens_on_loopback_unless_told_and_warns_then() {
    let cluster = agentrt_cluster().await;
    // The default address, when this machine has it free.
    match ConsoleProcess::try_start(cluster.kubeconfig(), &[]) {
        Ok(console) => assert!(
            console.url.starts_with("http://127.0.0.1:8765/?token="),
            "{}",
            console.url
        ),
        Err(err) if err.contains("cannot listen") => {
            eprintln!("skipped the default address: 127.0.0.1:8765 is taken here ({err})")
        }
        Err(err) => panic!("{err}"),
    }
    let console =
        ConsoleProcess::try_start(cluster.kubeconfig(), &["--addr", "0.0.0.0:0"]).expect("starts");
    let mut warned = String::new();
    for _ in 0..100 {
        warned = console.stderr.lock().unwrap().join("\n");
        if !warned.is_empty() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(warned.contains("beyond loopback"), "{warned}");
    assert!(!console.url.contains("127.0.0.1"), "{}", console.url);
}
