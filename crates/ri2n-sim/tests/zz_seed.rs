#[test]
fn seed() {
    let s = ri2n_sim::TcpScenario::random(437);
    let r = ri2n_sim::run_tcp(&s);
    eprintln!(
        "{:?}",
        r.map(|_| ())
            .map_err(|e| e.lines().next().unwrap().to_owned())
    );
}
