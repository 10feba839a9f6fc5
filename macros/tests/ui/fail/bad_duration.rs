use distlock::distributed_lock;

#[distributed_lock("orders:{id}", timeout = "5 seconds")]
async fn settle(id: u64) -> Result<(), distlock::Error> {
    let _ = id;
    Ok(())
}

fn main() {}
