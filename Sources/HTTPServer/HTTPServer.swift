/// The raw-socket HTTP/1.1 server. It knows nothing of jobs.
public enum HTTPServerModule {}
