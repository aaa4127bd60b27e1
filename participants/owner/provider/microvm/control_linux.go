//go:build linux

package microvm

import (
	"context"
	"fmt"
	"time"

	"github.com/stillpoint/stillpoint/participants/owner/provider"
	"github.com/stillpoint/stillpoint/sandboxd/vmctl"
)

// call sends a request on the control channel; a VM that exits meanwhile
// ends the call.
func (vm *machine) call(ctx context.Context, req vmctl.Request) (*vmctl.Response, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { // ends with the call: cancel closes ctx.Done
		select {
		case <-vm.exited:
			cancel()
		case <-ctx.Done():
		}
	}()
	resp, err := vm.ctl.Call(ctx, req)
	if err != nil && vm.gone() {
		return nil, fmt.Errorf("%w: the VM of %s exited: %w", provider.ErrExited, vm.id, err)
	}
	return resp, err
}

func (m *Provider) onNotice(id string, vm *machine) func(vmctl.Notice) {
	return func(n vmctl.Notice) {
		ev := m.log.Debug()
		switch n.Event {
		case vmctl.EventPowerOff:
			ev = m.log.Warn()
		case vmctl.EventInit:
			vm.initExited.Store(true)
		}
		ev.Str("sandbox", id).Str("event", string(n.Event)).Str("why", n.Why).Str("msg", n.Msg).Msg("microvm: guest notice")
	}
}

// startLease renews the guest's lease every third of it until stop.
func (m *Provider) startLease(vm *machine) {
	ctx, cancel := context.WithCancel(context.Background())
	vm.stopLease, vm.leaseDone = cancel, make(chan struct{})
	every := m.cfg.Lease / 3
	go func() { // stopped by vm.stop: stopLease, then <-leaseDone
		defer close(vm.leaseDone)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-vm.exited:
				return
			case <-t.C:
			}
			cctx, ccancel := context.WithTimeout(ctx, every)
			_, err := vm.call(cctx, vmctl.Request{Op: vmctl.OpLease, UntilMS: m.cfg.Lease.Milliseconds()})
			ccancel()
			if err != nil && ctx.Err() == nil {
				m.log.Warn().Err(err).Str("sandbox", vm.id).Msg("microvm: lease renewal failed")
			}
		}
	}()
}
