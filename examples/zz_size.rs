#[tokio::main]
async fn main() {
    let client = distlock::LockClient::memory();
    let m = client.mutex("k");
    let f = m.lock();
    println!("lock future {}", std::mem::size_of_val(&f));
    let g = f.await.unwrap();
    let r = g.release();
    println!("release future {}", std::mem::size_of_val(&r));
}
