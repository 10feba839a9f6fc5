// A Curator 5 InterProcessMutex driven line by line over stdin, for the interop tests:
//   args: <connect string> <lock path>
//   stdin: "try <ms>" -> GOT | BUSY, "lock" -> GOT, "release" -> RELEASED, "quit"
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.util.concurrent.TimeUnit;
import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;

public class CuratorLock {
    public static void main(String[] args) throws Exception {
        CuratorFramework client = Curators.connect(args[0]);
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
