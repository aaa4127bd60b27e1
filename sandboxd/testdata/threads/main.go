// Command threads is a test helper for sandboxd: a multi-threaded process
// with one thread blocked in a read on a FIFO and one thread that appends
// to a file every 2 ms. It writes "ready" to OUT once the reader is about
// to block, and "read <data>" when the read returns.
//
//	threads FIFO OUT
package main

import (
	"fmt"
	"os"
	"runtime"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: threads FIFO OUT")
		os.Exit(2)
	}
	fifo, out := os.Args[1], os.Args[2]
	busy, err := os.OpenFile(out+".busy", os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		panic(err)
	}
	go func() {
		runtime.LockOSThread()
		for i := 0; ; i++ {
			fmt.Fprintln(busy, i)
			time.Sleep(2 * time.Millisecond)
		}
	}()
	go func() {
		runtime.LockOSThread()
		// O_RDWR does not wait for a writer; the read then blocks this
		// thread in the kernel (S) until data arrives.
		fd, err := syscall.Open(fifo, syscall.O_RDWR, 0)
		if err != nil {
			panic(err)
		}
		_ = os.WriteFile(out, []byte("ready\n"), 0o644)
		buf := make([]byte, 64)
		n, err := syscall.Read(fd, buf)
		if err != nil {
			panic(err)
		}
		f, _ := os.OpenFile(out, os.O_WRONLY|os.O_APPEND, 0o644)
		fmt.Fprintf(f, "read %s\n", buf[:n])
		f.Close()
	}()
	select {}
}
