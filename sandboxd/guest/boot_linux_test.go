package guest

import (
	"testing"
	"time"
)

func TestParseCmdline(t *testing.T) {
	c, err := ParseCmdline("console=ttyS0 panic=-1 quiet tsc=reliable\n")
	if err != nil {
		t.Fatal(err)
	}
	want := BootConfig{Root: "/dev/vda", Bin: "/dev/vdb", BinDir: "/opt/stillpoint/bin", IP: "10.0.2.15/24", GW: "10.0.2.2", Port: "stillpoint.ctl"}
	if c != want {
		t.Fatalf("defaults: %+v", c)
	}
	c, err = ParseCmdline("quiet sp.root=/dev/vdc sp.bin=none sp.bindir=/bin2 sp.ip=10.0.2.16/24 sp.gw=10.0.2.3 sp.ctl=ctl2 sp.lease=2m0s other.x=1")
	if err != nil {
		t.Fatal(err)
	}
	want = BootConfig{Root: "/dev/vdc", Bin: "none", BinDir: "/bin2", IP: "10.0.2.16/24", GW: "10.0.2.3", Port: "ctl2", Lease: 2 * time.Minute}
	if c != want {
		t.Fatalf("set: %+v", c)
	}
	for _, bad := range []string{"sp.lease=soon", "sp.lease=-1s", "sp.bindir=rel"} {
		if _, err := ParseCmdline(bad); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
}
