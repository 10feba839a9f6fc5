// The Curator client every test harness opens: short sessions, a few quick retries, and a
// "NOT CONNECTED" line and exit if no server answers.
import java.util.concurrent.TimeUnit;
import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.retry.RetryNTimes;

public final class Curators {
    private Curators() {}

    static CuratorFramework connect(String connectString) throws InterruptedException {
        CuratorFramework client = CuratorFrameworkFactory.builder()
            .connectString(connectString)
            .sessionTimeoutMs(4000)
            .connectionTimeoutMs(4000)
            .retryPolicy(new RetryNTimes(3, 100))
            .build();
        client.start();
        if (!client.blockUntilConnected(20, TimeUnit.SECONDS)) {
            System.out.println("NOT CONNECTED");
            System.exit(1);
        }
        return client;
    }
}
