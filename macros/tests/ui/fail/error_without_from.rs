use distlock::distributed_lock;

#[derive(Debug)]
struct MyError;

#[distributed_lock("orders:{id}")]
async fn settle(id: u64) -> Result<(), MyError> {
    let _ = id;
    Ok(())
}

fn main() {}
