// A Go gateway holding a stdio server it started from a named function: `cat`, whose stdin is
// a pipe the gateway keeps and never writes, so the server waits on it (`idle`). The gateway
// lets go once the file named by its argument exists (10 minutes at most). Built by the Go
// spawner test (tests/tests/go_sites.rs) with the Go toolchain's defaults: frame pointers
// kept, the fork a raw clone from the syscall package.
package main

import (
	"os"
	"os/exec"
	"time"
)

//go:noinline
func startStdioServer() *exec.Cmd {
	cmd := exec.Command("cat")
	if _, err := cmd.StdinPipe(); err != nil {
		panic(err)
	}
	if err := cmd.Start(); err != nil {
		panic(err)
	}
	return cmd
}

func main() {
	server := startStdioServer()
	for deadline := time.Now().Add(10 * time.Minute); time.Now().Before(deadline); {
		if _, err := os.Stat(os.Args[1]); err == nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	server.Process.Kill()
	server.Wait()
}
