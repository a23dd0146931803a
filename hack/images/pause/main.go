// pause: the pod sandbox's process for the local cluster's real node (hack/images.sh).
//
// registry.k8s.io/pause cannot be pulled here, so the node's containerd runs this instead.
// Like the upstream one it only holds the pod's namespaces: it sleeps until SIGINT/SIGTERM
// and, as PID 1 of a pod that shares its PID namespace, reaps orphaned children.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "-v" {
		os.Stdout.WriteString("tunefleet local pause\n")
		return
	}
	if os.Getpid() != 1 {
		os.Stderr.WriteString("warning: pause should be the first process\n")
	}
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			// Reap every exited child; stop when none is left to reap.
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
