// A real HDFS for the tests (tests/hdfs_cluster.py): Hadoop's own MiniDFSCluster, a NameNode and one
// DataNode in this JVM, on loopback, WebHDFS on the NameNode's HTTP port. Run as a single source file
// (Java 11+) on the classpath scripts/install_hdfs.sh fetched from Maven Central:
//   java -cp '.hdfs/lib/*' tests/hdfs/MiniHdfs.java DIR
// It prints one line "ready <rpc port> <http port>" once HDFS answers, and stops (deleting nothing
// under DIR) when its standard input closes.
import java.io.File;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.hdfs.HdfsConfiguration;
import org.apache.hadoop.hdfs.MiniDFSCluster;

public class MiniHdfs {
  public static void main(String[] args) throws Exception {
    Configuration conf = new HdfsConfiguration();
    conf.set(MiniDFSCluster.HDFS_MINIDFS_BASEDIR, new File(args[0]).getAbsolutePath());
    conf.set("dfs.namenode.http-address", "127.0.0.1:0");
    conf.set("dfs.namenode.rpc-address", "127.0.0.1:0");
    conf.setBoolean("dfs.webhdfs.enabled", true);
    conf.set("dfs.permissions.enabled", "false");
    conf.set("hadoop.security.authentication", "simple");
    MiniDFSCluster cluster = new MiniDFSCluster.Builder(conf).numDataNodes(1).format(true).build();
    cluster.waitActive();
    int rpc = cluster.getNameNodePort();
    int http = cluster.getNameNode().getHttpAddress().getPort();
    System.out.println("ready " + rpc + " " + http);
    System.out.flush();
    while (System.in.read() != -1) { }
    cluster.shutdown();
  }
}
