// A static Go gateway (no C library of its own: Go's defaults without cgo) that starts its
// helper through a C spawner: it runs the command given after RELEASE with two more
// arguments, 3 and 4, the helper's stdin (a pipe the gateway keeps and never writes) and where
// the spawner writes the helper's pid; the spawner forks the helper through its C library and
// exits at once (as `sh -c 'helper &'` does). Nothing the run reads maps that C library but
// the spawner itself, gone a moment after its fork. Once the helper's pid arrived and the
// spawner is reaped, the gateway waits until RELEASE exists (10 minutes at most), then closes
// the helper's stdin. Built by tests/tests/go_sites.rs.
package main

import (
	"io"
	"os"
	"os/exec"
	"time"
)

func main() {
	release, spawner := os.Args[1], os.Args[2:]
	stdinRead, stdinWrite, err := os.Pipe()
	if err != nil {
		panic(err)
	}
	pidRead, pidWrite, err := os.Pipe()
	if err != nil {
		panic(err)
	}
	cmd := exec.Command(spawner[0], append(spawner[1:], "3", "4")...)
	cmd.ExtraFiles = []*os.File{stdinRead, pidWrite}
	if err := cmd.Start(); err != nil {
		panic(err)
	}
	stdinRead.Close()
	pidWrite.Close()
	var helper [4]byte
	if _, err := io.ReadFull(pidRead, helper[:]); err != nil {
		panic(err)
	}
	cmd.Wait()
	for deadline := time.Now().Add(10 * time.Minute); time.Now().Before(deadline); {
		if _, err := os.Stat(release); err == nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	stdinWrite.Close()
}
