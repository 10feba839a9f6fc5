use distlock::distributed_lock;

#[distributed_lock("orders:{order}")]
async fn settle(order_id: u64) -> Result<(), distlock::Error> {
    let _ = order_id;
    Ok(())
}

fn main() {}
