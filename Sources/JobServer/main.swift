import JobCore
import HTTPServer

print("jobserver: not yet serving")
