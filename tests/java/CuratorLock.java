// A Curator 5 InterProcessMutex driven line by line over stdin, for the interop tests:
//   args: <connect string> <lock path>
//   stdin: "try <ms>" -> GOT | BUSY, "lock" -> GOT, "release" -> RELEASED, "quit"
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.util.concurrent.TimeUnit;
import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.retry.RetryNTimes;

public class CuratorLock {
    public static void main(String[] args) throws Exception {
        CuratorFramework client = CuratorFrameworkFactory.builder()
            .connectString(args[0])
            .sessionTimeoutMs(4000)
            .connectionTimeoutMs(4000)
            .retryPolicy(new RetryNTimes(3, 100))
            .build();
        client.start();
        if (!client.blockUntilConnected(20, TimeUnit.SECONDS)) {
            System.out.println("NOT CONNECTED");
            System.exit(1);
        }
        InterProcessMutex mutex = new InterProcessMutex(client, args[1]);
        System.out.println("READY");
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        String line;
        while ((line = in.readLine()) != null) {
            String[] cmd = line.trim().split(" ");
            switch (cmd[0]) {
                case "try":
                    boolean got = mutex.acquire(Long.parseLong(cmd[1]), TimeUnit.MILLISECONDS);
                    System.out.println(got ? "GOT" : "BUSY");
                    break;
                case "lock":
                    mutex.acquire();
                    System.out.println("GOT");
                    break;
                case "release":
                    mutex.release();
                    System.out.println("RELEASED");
                    break;
                case "quit":
                    client.close();
                    System.out.println("BYE");
                    return;
                default:
                    System.out.println("UNKNOWN " + line);
            }
        }
        client.close();
    }
}
